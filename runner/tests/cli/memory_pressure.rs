//! The expert cache under memory pressure (`cache_reserve_mb`, issue 35), for real: bmoe streams
//! a model inside a cgroup v1 memory group of its own, with a cache that holds most of the
//! group's limit; mid-run a second process in the same group (an "app") takes memory in steps,
//! holds it and frees it. bmoe is the OOM killer's first choice (`oom_score_adj = 1000`), as
//! Android marks a background app: when the group runs out, bmoe is what goes.
//! With a reserve, bmoe's cache shrinks, bmoe is not killed, the cache grows back once the app
//! is gone, and every item's text equals an undisturbed run's. Without one, the kernel's OOM
//! killer ends bmoe: the control that shows the pressure is real.
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};

use crate::common::cgroup::Group;
use crate::common::{text, Project};

const MIB: u64 = 1 << 20;
/// The group's limit. bmoe alone holds about 50 MiB besides its cache, whose routed experts
/// fill to about 120 MiB of the model's 216 MiB after a few items (measured: 52 MiB + 123 MiB
/// peak after one long prompt).
const LIMIT_MIB: u64 = 300;
/// What the app takes: with bmoe's ~170 MiB that is far over the limit, and with bmoe's cache
/// shrunk to the layer it computes (27 MiB at most) well under it.
const APP_STEPS: u64 = 11;
const APP_STEP_MIB: u64 = 16;
/// Between the app's steps: bmoe samples memory every 100 ms at its routing nodes.
const APP_STEP_MS: u64 = 150;
const CACHE_MB: u64 = 160;
const RESERVE_MB: u64 = 40;
const ITEMS: usize = 30;

/// The small preset with wider experts (0.84 MiB each): a cache of real size in little time.
fn model(p: &Project) -> PathBuf {
    let path = p.path("models/pressure.gguf");
    let spec = SynthSpec {
        n_ff_exp: 1024,
        ..SynthSpec::preset(Preset::Small, SynthArch::Qwen3Moe)
    };
    write_model(&spec, &path).expect("write the model");
    path
}

fn job(p: &Project, name: &str, reserve_mb: u64) -> String {
    let prompts = (1..=ITEMS)
        .map(|i| {
            format!(
                "{{ id = \"p{i}\", text = \"Item {i}: the phone runs short of memory while a second app starts, and the model keeps decoding.\" }}"
            )
        })
        .collect::<Vec<_>>()
        .join(",\n  ");
    let rel = format!("jobs/{name}.toml");
    p.write(
        &rel,
        &format!(
            r#"
name = "{name}"
model = "../models/pressure.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/{name}.csv"
prompts = [
  {prompts}
]
n_predict = 24

[overrides]
moe_stream = true
cache_mb = {CACHE_MB}
cache_reserve_mb = {reserve_mb}
"#
        ),
    );
    rel
}

/// The app: takes `APP_STEPS` x `APP_STEP_MIB` MiB (every page written), says `held`, and
/// frees it all when its stdin closes.
fn start_app(g: &Group, cwd: &Path) -> Child {
    let script = format!(
        "import sys, time\nheld = []\nfor _ in range({APP_STEPS}):\n    held.append(b'\\x01' * ({APP_STEP_MIB} << 20))\n    time.sleep({})\nprint('held', flush=True)\nsys.stdin.read()\n",
        APP_STEP_MS as f64 / 1000.0
    );
    g.spawn(cwd, false, "python3", &["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python3 (the app that takes memory)")
}

/// Waits until `csv` holds at least `n` rows or `child` ended; false on the latter.
fn wait_rows(p: &Project, csv: &str, n: usize, child: &mut Child) -> bool {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        if p.read(csv).lines().count() > n {
            return true;
        }
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{csv}: no {n} rows within 120 s");
}

fn rows(csv: &str) -> Vec<HashMap<String, String>> {
    csv::Reader::from_reader(csv.as_bytes())
        .deserialize()
        .map(|r| r.expect("a CSV row"))
        .collect()
}

fn sum(rows: &[HashMap<String, String>], col: &str) -> u64 {
    rows.iter().map(|r| r[col].parse::<u64>().unwrap()).sum()
}

/// Runs `job` in a fresh group, starts the app after two rows, frees its memory once it holds
/// all of it (after `hold`), and returns bmoe's exit status and stderr.
fn pressured_run(p: &Project, job: &str, hold: Duration) -> (std::process::ExitStatus, String) {
    let g = Group::new("pressure", LIMIT_MIB * MIB).expect("a cgroup");
    let bmoe = g
        .spawn(
            p.dir.path(),
            true,
            env!("CARGO_BIN_EXE_bmoe"),
            &["run", job],
        )
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start bmoe");
    let mut bmoe = bmoe;
    let err = bmoe.stderr.take().unwrap();
    // Each stderr line with when it came, to time the growth after the app is gone.
    let reader = std::thread::spawn(move || {
        BufReader::new(err)
            .lines()
            .map_while(Result::ok)
            .map(|l| (Instant::now(), l))
            .collect::<Vec<_>>()
    });
    let csv = format!(
        "runs/{}.csv",
        Path::new(job).file_stem().unwrap().to_str().unwrap()
    );
    assert!(
        wait_rows(p, &csv, 2, &mut bmoe),
        "bmoe ended before the app started"
    );
    let mut app = start_app(&g, p.dir.path());
    let mut line = String::new();
    BufReader::new(app.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    std::thread::sleep(hold);
    drop(app.stdin.take());
    let _ = app.wait();
    let freed = Instant::now();
    let status = bmoe.wait().unwrap();
    let lines = reader.join().unwrap();
    let regrown = lines
        .iter()
        .find(|(t, l)| *t > freed && l.contains("may grow back"))
        .map(|(t, _)| format!("{:.2} s", t.duration_since(freed).as_secs_f64()));
    let stderr: String = lines.into_iter().map(|(_, l)| l + "\n").collect();
    eprintln!(
        "{job}: app said {:?}; OOM kills in the group: {}; bmoe: {status}; first growth {} after the app freed its memory\n{stderr}",
        line.trim(),
        g.oom_kills(),
        regrown.as_deref().unwrap_or("never")
    );
    (status, stderr)
}

#[test]
fn the_cache_gives_memory_back_under_pressure_and_the_output_stays() {
    if Group::new("probe", LIMIT_MIB * MIB).is_none() {
        eprintln!("skipped: needs root and the cgroup v1 memory controller");
        return;
    }
    let p = Project::new();
    model(&p);
    // Undisturbed: the same settings, no group; the reserve never acts.
    let quiet = job(&p, "quiet", RESERVE_MB);
    let o = p.bmoe(&["run", &quiet]);
    assert!(o.status.success(), "{}", text(&o));
    let want = rows(&p.read("runs/quiet.csv"));
    assert_eq!(want.len(), ITEMS);
    assert_eq!(sum(&want, "cache_shrinks"), 0, "{}", text(&o));

    // Pressed, with the reserve: shrinks, lives, grows back, same text.
    let pressed = job(&p, "pressed", RESERVE_MB);
    let (status, stderr) = pressured_run(&p, &pressed, Duration::from_millis(500));
    assert!(status.success(), "bmoe under pressure: {status}\n{stderr}");
    let got = rows(&p.read("runs/pressed.csv"));
    assert_eq!(got.len(), ITEMS, "{stderr}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["item"], w["item"]);
        assert_eq!(g["text"], w["text"], "item {}: text differs", g["item"]);
    }
    let (shrinks, grows) = (sum(&got, "cache_shrinks"), sum(&got, "cache_grows"));
    assert!(shrinks > 0 && grows > 0, "shrinks {shrinks}, grows {grows}");
    assert_eq!(
        stderr.matches("the expert cache shrinks from").count() as u64,
        shrinks,
        "one line per shrink\n{stderr}"
    );
    assert_eq!(
        stderr.matches("may grow back from").count() as u64,
        grows,
        "one line per growth\n{stderr}"
    );
    // Back to cache_mb by the last item, with the default read-ahead's staging (4 experts of
    // 0.84 MiB) lent on top while its reads ahead pause.
    let last = got.last().unwrap();
    let budget = last["cache_budget_mib"].parse::<f64>().unwrap();
    assert!(
        (CACHE_MB as f64..=CACHE_MB as f64 + 4.0).contains(&budget),
        "the budget is back to cache_mb by the last item: {budget}\n{stderr}"
    );

    // The control: without the reserve the same app gets bmoe killed.
    let control = job(&p, "control", 0);
    let (status, stderr) = pressured_run(&p, &control, Duration::from_millis(500));
    assert_eq!(
        status.signal(),
        Some(9),
        "without cache_reserve_mb the OOM killer should end bmoe: {status}\n{stderr}"
    );
    let _ = std::io::stderr().flush();
}
