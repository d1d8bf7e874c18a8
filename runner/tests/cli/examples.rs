//! The shipped examples (profiles/, jobs/) check, plan and run against the tiny model.
use crate::common;
use common::{text, Project};

#[test]
fn every_example_job_checks_with_every_profile() {
    let p = Project::with_examples();
    let jobs: Vec<String> = std::fs::read_dir(p.path("jobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .map(|n| format!("jobs/{n}"))
        .collect();
    assert!(jobs.len() >= 3, "{jobs:?}");
    let profiles: Vec<String> = std::fs::read_dir(p.path("profiles"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| format!("profiles/{}", e.file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".toml"))
        .collect();
    assert!(profiles.len() >= 5, "{profiles:?}");
    for prof in &profiles {
        let mut args = vec!["check", "--profile", prof.as_str()];
        args.extend(jobs.iter().map(|s| s.as_str()));
        let o = p.bmoe(&args);
        assert!(o.status.success(), "{prof}: {}", text(&o));
    }
}

#[test]
fn demo_job_runs_and_writes_its_csv() {
    let p = Project::with_examples();
    let o = p.bmoe(&["run", "jobs/demo.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("3 rows appended to runs/demo.csv"), "{out}");
    assert_eq!(common::data_lines(&p.read("runs/demo.csv")).len(), 3);
}

#[test]
fn plan_explains_values_placement_and_budget() {
    let p = Project::with_examples();
    let o = p.bmoe(&[
        "plan",
        "jobs/agent-replay.toml",
        "--profile",
        "profiles/galaxy-s22.toml",
        "--set",
        "threads=3",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // Origins of values: default, profile, job overrides, --set.
    assert!(
        out.contains("threads         3              --set"),
        "{out}"
    );
    assert!(
        out.contains("job jobs/agent-replay.toml [overrides]"),
        "{out}"
    );
    assert!(out.contains("profile profiles/galaxy-s22.toml"), "{out}");
    assert!(
        out.contains("routed_full     0.85           default"),
        "{out}"
    );
    // Hexagon v69 refuses the NPU with a reason.
    assert!(out.contains("CPU (Hexagon v69 is older than v73"), "{out}");
    assert!(out.contains("KV cache"), "{out}");
    assert!(out.contains("auto -> "), "{out}");
}

#[test]
fn an_unregistered_device_from_a_profile_is_a_warning_per_unit_and_recorded() {
    let p = Project::with_examples();
    let warning = "warning: demo on profile oneplus-15 (point base): prefill device HTP0 (from profile profiles/oneplus-15.toml) is not used: HTP0 is not in this build's registry";
    for cmd in ["check", "plan"] {
        let o = p.bmoe(&[
            cmd,
            "jobs/demo.toml",
            "--profile",
            "profiles/oneplus-15.toml",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains(warning), "{cmd}: {}", text(&o));
    }
    let o = p.bmoe(&[
        "plan",
        "jobs/demo.toml",
        "--profile",
        "profiles/oneplus-15.toml",
    ]);
    assert!(
        text(&o).contains("CPU (HTP0 is not in this build's registry, which has: "),
        "{}",
        text(&o)
    );
    let o = p.bmoe(&[
        "run",
        "jobs/demo.toml",
        "--profile",
        "profiles/oneplus-15.toml",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).matches(warning).count(), 1, "{}", text(&o));
    let csv = p.read("runs/demo.csv");
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let head = r.headers().unwrap().clone();
    let col = |n: &str| head.iter().position(|h| h == n).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    assert_eq!(rows.len(), 3);
    for row in rows {
        assert_eq!(&row[col("prefill_device_requested")], "HTP0");
        assert_eq!(&row[col("prefill_device_plan")], "");
        assert_eq!(&row[col("prefill_device")], "", "the CPU ran prefill");
    }
}

#[test]
fn a_device_named_with_set_that_cannot_run_is_an_error_unless_allowed() {
    let p = Project::with_examples();
    for cmd in ["check", "plan", "run"] {
        let o = p.bmoe(&[cmd, "jobs/demo.toml", "--set", "device=CUDA0", "--quiet"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", text(&o));
        assert!(
            text(&o).contains("prefill device CUDA0 (from --set) cannot run here: CUDA0 is not in this build's registry")
                && text(&o).contains("--allow-cpu-fallback"),
            "{cmd}: {}",
            text(&o)
        );
    }
    assert!(!p.path("runs/demo.csv").exists(), "nothing written");
    let o = p.bmoe(&[
        "run",
        "jobs/demo.toml",
        "--set",
        "device=CUDA0",
        "--allow-cpu-fallback",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("warning: demo on profile host-cpu (point base): prefill device CUDA0 (from --set) is not used"), "{}", text(&o));
    let csv = p.read("runs/demo.csv");
    assert!(csv.lines().nth(1).unwrap().contains(",CUDA0"), "{csv}");
}

#[test]
fn a_sweep_runs_once_per_point() {
    let p = Project::with_examples();
    let o = p.bmoe(&["run", "jobs/sweep-cache.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = p.read("runs/sweep-cache.csv");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h = rdr.headers().unwrap().clone();
    let point = h.iter().position(|c| c == "point").unwrap();
    let cache = h.iter().position(|c| c == "cache_mb").unwrap();
    let mut per_point = std::collections::BTreeMap::<String, (usize, String)>::new();
    for r in rdr.records() {
        let r = r.unwrap();
        let e = per_point
            .entry(r[point].to_string())
            .or_insert((0, r[cache].to_string()));
        e.0 += 1;
    }
    let decisions = p.read("jobs/agent-replay.jsonl").lines().count();
    assert_eq!(per_point.len(), 3, "{per_point:?}");
    for (label, (n, cache_mb)) in &per_point {
        assert_eq!(*n, decisions, "{label}");
        assert_eq!(label, &format!("cache_mb={cache_mb}"));
    }
}

#[test]
fn ctrl_c_finishes_the_row_in_flight_and_exits_cleanly() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 60);
    p.write("jobs/job.toml", common::DECIDE_JOB);
    let child = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "r1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while common::data_lines(&p.read("runs/decide.csv")).len() < 2 {
        assert!(t0.elapsed().as_secs() < 120, "no rows");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(130), "{out}");
    assert!(
        out.contains("finishing the row in flight, then stopping"),
        "{out}"
    );
    assert!(out.contains("--resume --run-id r1"), "{out}");
    let csv = p.read("runs/decide.csv");
    assert!(csv.ends_with('\n'));
    let n = common::data_lines(&csv).len();
    assert!(n < 60, "{n}");
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--resume",
        "--run-id",
        "r1",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(common::data_lines(&p.read("runs/decide.csv")).len(), 60);
}

#[test]
fn explain_without_a_prefill_device_is_a_warning_not_silence() {
    let p = Project::with_examples();
    let o = p.bmoe(&["plan", "jobs/demo.toml", "--set", "explain=true"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("warning: demo on profile host-cpu (point base): explain (--set) profiles device prefill, and no prefill device runs: it does nothing"),
        "{}",
        text(&o)
    );
}

#[test]
fn plan_shows_the_cores_and_a_run_computes_on_them() {
    let p = Project::with_examples();
    let first = first_allowed_cpu();
    let o = p.bmoe(&["plan", "jobs/demo.toml", "--set", &format!("cpus={first}")]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!("cores: compute on {first}")) && out.contains("(as set)"),
        "{out}"
    );
    // `auto` on a machine without cpufreq (or with equal cores) pins nothing, and says why.
    let o = p.bmoe(&["plan", "jobs/demo.toml"]);
    assert!(
        text(&o).contains("cores: cpus = auto: not pinned"),
        "{}",
        text(&o)
    );
    // A CPU this process may not use is an error that names it, before anything runs.
    let o = p.bmoe(&["run", "jobs/demo.toml", "--set", "cpus=1000"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("CPU 1000 is not one this process may use"),
        "{}",
        text(&o)
    );
    let o = p.bmoe(&["run", "jobs/demo.toml", "--set", &format!("cpus={first}")]);
    assert!(o.status.success(), "{}", text(&o));
}

/// The first CPU this process may use (`Cpus_allowed_list` of /proc/self/status).
fn first_allowed_cpu() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    line["Cpus_allowed_list:".len()..]
        .trim()
        .split(['-', ','])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn profile_measure_writes_a_profile_that_checks_and_plans_with_its_read_floor() {
    let p = Project::with_examples();
    let args = [
        "profile",
        "measure",
        "-o",
        "profiles/here.toml",
        "--seconds",
        "0.2",
        "--scratch-mb",
        "8",
    ];
    let o = p.bmoe(&args);
    assert!(o.status.success(), "{}", text(&o));
    let written = p.read("profiles/here.toml");
    for key in [
        "ram_mb = ",
        "read_mib_s = [",
        "page_moves = ",
        "kernel = ",
        "core_max_mhz = [",
    ] {
        assert!(written.contains(key), "{key} in {written}");
    }
    // The scratch file is gone; the profile checks and plans, with the floor it measured.
    let left: Vec<_> = std::fs::read_dir(p.path("profiles"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".bmoe-measure"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let o = p.bmoe(&["plan", "jobs/demo.toml", "--profile", "profiles/here.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("read floor: one expert of a layer"),
        "{}",
        text(&o)
    );
    // An existing file is kept unless --force; a name a profile cannot have is refused.
    let o = p.bmoe(&args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exists: give --force"), "{}", text(&o));
    let o = p.bmoe(&["profile", "measure", "-o", "profiles/bad name.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("expected a file NAME.toml"),
        "{}",
        text(&o)
    );
}

/// `repack` is a setting like any other: a sweep over it runs a resident model with Q4_0 experts
/// (a type with a repacked kernel on AVX2 and on ARM with dotprod or i8mm) both ways, and every
/// row records the setting and the weights the model that ran held repacked.
#[test]
fn a_repack_sweep_records_the_setting_and_the_repacked_weights() {
    let p = Project::new();
    let o = p.bmoe(&[
        "synth",
        "-o",
        "models/q4.gguf",
        "--embd",
        "256",
        "--ff",
        "256",
        "--expert-type",
        "q4_0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    p.decisions("jobs/d.jsonl", 2);
    p.write(
        "jobs/repack.toml",
        r#"
name = "repack"
model = "../models/q4.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/repack.csv"
decisions_file = "d.jsonl"
[sweep]
repack = ["auto", "off"]
"#,
    );
    let o = p.bmoe(&["run", "jobs/repack.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = p.read("runs/repack.csv");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h = rdr.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let (setting, tensors) = (col("repack"), col("repacked_tensors"));
    let mut seen = std::collections::BTreeMap::new();
    for r in rdr.records() {
        let r = r.unwrap();
        let n: u64 = r[tensors].parse().unwrap();
        seen.insert(r[setting].to_string(), n);
    }
    assert_eq!(seen.get("off"), Some(&0), "{seen:?}");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        assert!(seen.get("auto").is_some_and(|n| *n > 0), "{seen:?}");
    }
}
