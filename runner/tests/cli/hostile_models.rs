//! Corrupt and hostile model files never crash bmoe: the two crash classes of issue 15 and every
//! input that ever crashed (fixtures), a seeded time-bounded fuzz over damaged copies of the tiny
//! model, and the same for profiles, jobs and JSONL decision lines. Each run is a child process
//! (`bmoe generate` / `bmoe check`) judged from outside: no signal, no panic, and every failure a
//! clear `error:` line.
//!
//! Long runs: `scripts/fuzz` (FUZZ_SEED, FUZZ_ITERS, FUZZ_SECS, FUZZ_THREADS, FUZZ_OUT,
//! FUZZ_DAMAGE: `fields`, `structure` or `both`).
use crate::common;
use crate::hostile;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};
use common::{text, Project};
use hostile::structure::{layout, mutate_structure, Layout};
use hostile::{apply, mutate, parse_patches, patches_text, run_judged, walk, Patch, Rng, Verdict};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_bmoe"))
}

fn tiny_bytes() -> Vec<u8> {
    std::fs::read(common::model_path()).expect("read the tiny model")
}

/// The tiny model of `arch` (`bmoe synth --preset tiny --arch ARCH`; deterministic).
fn tiny_bytes_of(arch: &str) -> Vec<u8> {
    let a = SynthArch::parse(arch).unwrap_or_else(|| panic!("unknown architecture {arch}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("tiny.gguf");
    write_model(&SynthSpec::preset(Preset::Tiny, a), &p).expect("write the tiny model");
    std::fs::read(&p).expect("read the tiny model")
}

/// How a damaged model is loaded: llama.cpp's own (resident) load, or the streamed lean load
/// (`--moe-stream --cache-mb 1`: llama.cpp builds the model from the header alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Resident,
    Stream,
}

impl Mode {
    fn parse(s: &str) -> Mode {
        match s {
            "resident" => Mode::Resident,
            "stream" => Mode::Stream,
            _ => panic!("mode {s}: expected resident or stream"),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Mode::Resident => "resident",
            Mode::Stream => "stream",
        }
    }
}

/// The generate command every damaged model goes through: load, tokenize, two tokens.
fn generate_args(model: &Path, mode: Mode) -> Vec<String> {
    let mut a: Vec<String> = [
        "generate",
        "-m",
        &model.to_string_lossy(),
        "-p",
        "hi",
        "-n",
        "2",
        "-t",
        "1",
        "-c",
        "64",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if mode == Mode::Stream {
        a.extend(["--moe-stream", "--cache-mb", "1"].map(String::from));
    }
    a
}

fn judge_model(bytes: &[u8], dir: &Path, name: &str) -> (Verdict, String) {
    judge_model_as(bytes, dir, name, Mode::Resident)
}

fn judge_model_as(bytes: &[u8], dir: &Path, name: &str, mode: Mode) -> (Verdict, String) {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write damaged model");
    let args = generate_args(&p, mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (v, o) = run_judged(&bin(), &args, Duration::from_secs(60));
    (v, text(&o))
}

/// A patch that replaces `old` (found exactly once in the tiny model) with `new`.
fn replace_once(b: &[u8], old: &[u8], new: &[u8]) -> Patch {
    assert_eq!(old.len(), new.len());
    let hits: Vec<usize> = b
        .windows(old.len())
        .enumerate()
        .filter(|(_, w)| *w == old)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{:?} should occur once",
        String::from_utf8_lossy(old)
    );
    Patch {
        off: hits[0],
        bytes: new.to_vec(),
        remove: None,
    }
}

/// Issue 15, crash class 1: the byte-fallback token for 'h' no longer exists, so tokenizing "hi"
/// made llama_tokenize throw std::out_of_range into Rust (SIGABRT).
#[test]
fn missing_byte_fallback_token_is_refused() {
    let b = tiny_bytes();
    let d = apply(&b, &[replace_once(&b, b"<0x68>", b"<0x6G>")]);
    let dir = tempfile::tempdir().unwrap();
    let (v, out) = judge_model(&d, dir.path(), "nobyte.gguf");
    assert_eq!(v, Verdict::Refused, "{out}");
    assert!(
        out.contains("tokenizer.ggml.tokens") && out.contains("<0x68> is missing"),
        "{out}"
    );
}

/// Issue 15, crash class 2: two equal token strings made the loader stop on
/// GGML_ASSERT(id_to_token.size() == token_to_id.size()) (SIGABRT).
#[test]
fn duplicate_token_strings_are_refused() {
    let b = tiny_bytes();
    let d = apply(&b, &[replace_once(&b, b"<0x41>", b"<0x42>")]);
    let dir = tempfile::tempdir().unwrap();
    let (v, out) = judge_model(&d, dir.path(), "dup.gguf");
    assert_eq!(v, Verdict::Refused, "{out}");
    assert!(
        out.contains("tokens 68 and 69 are both \"<0x42>\""),
        "{out}"
    );
}

/// Every input that ever crashed: `tests/fixtures/hostile/*.patch`, patches to the tiny model
/// (deterministic, so the damaged bytes are exactly reproducible).
#[test]
fn regression_fixtures_fail_cleanly() {
    let b = tiny_bytes();
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&fixtures)
        .expect("fixtures folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    entries.sort();
    for p in entries {
        let fixture = std::fs::read_to_string(&p).unwrap();
        let patches = parse_patches(&fixture);
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        // `# arch: NAME` (default qwen3moe) and `# mode: resident|stream` (default resident).
        let tag = |k: &str| {
            fixture
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::trim)
        };
        let base = match tag("# arch: ") {
            Some(a) => tiny_bytes_of(a),
            None => b.clone(),
        };
        let mode = tag("# mode: ").map_or(Mode::Resident, Mode::parse);
        let (v, out) = judge_model_as(
            &apply(&base, &patches),
            dir.path(),
            &format!("{name}.gguf"),
            mode,
        );
        assert!(!matches!(v, Verdict::Crash(_)), "{name}: {v:?}\n{out}");
        // `# expect: <text>`: the refusal must say this, which also proves the patch still hits
        // the field it was written for (the tiny model is deterministic).
        for want in fixture.lines().filter_map(|l| l.strip_prefix("# expect: ")) {
            assert_eq!(v, Verdict::Refused, "{name}: {out}");
            assert!(
                out.contains(want.trim()),
                "{name}: expected {want:?} in:\n{out}"
            );
        }
        n += 1;
    }
    assert!(n > 0, "no fixtures found in {}", fixtures.display());
}

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// One fuzz campaign: `iters` damaged copies of one architecture's tiny model, loaded one way.
struct Campaign {
    arch: String,
    mode: Mode,
    seed: u64,
    iters: usize,
    secs: u64,
    threads: usize,
    out_dir: Option<PathBuf>,
    /// `fields` (bytes of one field changed in place), `structure` (GGUF-aware splices:
    /// `hostile::structure`) or `both` (alternating case by case; the default).
    damage: String,
}

/// The tiny model's header mapped both ways the damage needs it.
struct Shape {
    fields: Vec<hostile::Field>,
    header_end: usize,
    layout: Layout,
}

/// What a campaign saw: [ran, refused, crashed], the crash recipes, and its wall time.
struct Outcome {
    counts: [usize; 3],
    crashes: Vec<String>,
    secs: f64,
}

/// A refusal's `error:` line with its numbers as `N`, so the campaign's refusals can be read as a
/// short list of kinds (each should name the key, tensor or field that is wrong).
fn refusal_kind(out: &str) -> String {
    let line = out.lines().find(|l| l.starts_with("error: ")).unwrap_or("");
    let mut kind = String::with_capacity(line.len());
    let mut in_number = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                kind.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            kind.push(c);
        }
    }
    kind
}

/// `FUZZ_OUT/refusals-ARCH-MODE-SEED.txt`: each kind of refusal with its count, most seen first.
fn write_refusals(c: &Campaign, kinds: &BTreeMap<String, usize>) {
    let Some(o) = &c.out_dir else { return };
    let mut v: Vec<_> = kinds.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let body: String = v.iter().map(|(k, n)| format!("{n:>7} {k}\n")).collect();
    let f = format!("refusals-{}-{}-{}.txt", c.arch, c.mode.name(), c.seed);
    let _ = std::fs::create_dir_all(o);
    let _ = std::fs::write(o.join(f), body);
}

impl Campaign {
    /// From the environment (`FUZZ_SEED`, `FUZZ_ITERS`, `FUZZ_SECS`, `FUZZ_THREADS`, `FUZZ_OUT`),
    /// with this test's defaults.
    fn from_env(arch: &str, mode: Mode, iters: usize, secs: u64) -> Campaign {
        Campaign {
            arch: arch.to_string(),
            mode,
            seed: env_or("FUZZ_SEED", 15),
            iters: env_or("FUZZ_ITERS", iters),
            secs: env_or("FUZZ_SECS", secs),
            threads: env_or("FUZZ_THREADS", 2),
            out_dir: std::env::var("FUZZ_OUT").ok().map(PathBuf::from),
            damage: std::env::var("FUZZ_DAMAGE").unwrap_or_else(|_| "both".into()),
        }
    }

    /// Case `i`: its own stream, so a crash is reproducible from (arch, mode, seed, i).
    fn case(&self, b: &[u8], shape: &Shape, i: usize) -> Vec<Patch> {
        let mut rng = Rng::new(self.seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
        let structural = match self.damage.as_str() {
            "fields" => false,
            "structure" => true,
            _ => i % 2 == 1,
        };
        if structural {
            mutate_structure(b, &shape.layout, &mut rng)
        } else {
            mutate(b, &shape.fields, shape.header_end, &mut rng)
        }
    }

    /// The fixture text of a crash (`# arch:` and `# mode:` say how to replay it).
    fn recipe(&self, i: usize, why: &str, out: &str, patches: &[Patch]) -> String {
        format!(
            "# seed {} iteration {i}: {why}\n# {}\n# arch: {}\n# mode: {}\n{}",
            self.seed,
            out.lines().rev().take(3).collect::<Vec<_>>().join(" / "),
            self.arch,
            self.mode.name(),
            patches_text(patches)
        )
    }

    /// Every 1000 cases a line, so a long run stopped early still says what it did.
    fn progress(&self, c: &[usize; 3], t0: Instant) {
        let n: usize = c.iter().sum();
        if n.is_multiple_of(1000) && n < self.iters {
            eprintln!(
                "fuzz progress: {} {} seed {}: {n} so far: {} ran, {} refused, {} crashed ({:.1} cases/s)",
                self.arch,
                self.mode.name(),
                self.seed,
                c[0],
                c[1],
                c[2],
                n as f64 / t0.elapsed().as_secs_f64().max(1e-9)
            );
        }
    }

    fn run(&self) -> Outcome {
        let t0 = Instant::now();
        let b = tiny_bytes_of(&self.arch);
        let (fields, header_end) = walk(&b).expect("the tiny model's header walks");
        let layout = layout(&b).expect("the tiny model's header lays out");
        let shape = Shape {
            fields,
            header_end,
            layout,
        };
        let dir = tempfile::tempdir().unwrap();
        let next = AtomicUsize::new(0);
        let state = Mutex::new((
            [0usize; 3],
            Vec::<String>::new(),
            BTreeMap::<String, usize>::new(),
        ));
        let deadline = t0 + Duration::from_secs(self.secs);
        std::thread::scope(|s| {
            for w in 0..self.threads.max(1) {
                let (b, shape, dir, next, state) = (&b, &shape, &dir, &next, &state);
                s.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= self.iters || Instant::now() > deadline {
                        break;
                    }
                    let patches = self.case(b, shape, i);
                    let name = format!("w{w}.gguf");
                    let (v, out) =
                        judge_model_as(&apply(b, &patches), dir.path(), &name, self.mode);
                    let mut st = state.lock().unwrap();
                    match &v {
                        Verdict::Ran => st.0[0] += 1,
                        Verdict::Refused => {
                            st.0[1] += 1;
                            *st.2.entry(refusal_kind(&out)).or_default() += 1;
                        }
                        Verdict::Crash(why) => {
                            st.0[2] += 1;
                            let recipe = self.recipe(i, why, &out, &patches);
                            if let Some(o) = &self.out_dir {
                                let _ = std::fs::create_dir_all(o);
                                let f = format!(
                                    "crash-{}-{}-{}-{i}.patch",
                                    self.arch,
                                    self.mode.name(),
                                    self.seed
                                );
                                let _ = std::fs::write(o.join(f), &recipe);
                            }
                            st.1.push(recipe);
                        }
                    }
                    self.progress(&st.0, t0);
                });
            }
        });
        let (counts, crashes, kinds) = state.into_inner().unwrap();
        write_refusals(self, &kinds);
        let secs = t0.elapsed().as_secs_f64();
        let total: usize = counts.iter().sum();
        eprintln!(
            "fuzz models: {} {} seed {}: {total} damaged models: {} loaded and ran, {} refused with an error ({} kinds), {} crashed ({:.1} cases/s)",
            self.arch,
            self.mode.name(),
            self.seed,
            counts[0],
            counts[1],
            kinds.len(),
            counts[2],
            total as f64 / secs.max(1e-9)
        );
        Outcome {
            counts,
            crashes,
            secs,
        }
    }
}

fn assert_clean(c: &Campaign, o: &Outcome) {
    assert!(
        o.crashes.is_empty(),
        "{} {}: {} crash(es):\n{}",
        c.arch,
        c.mode.name(),
        o.crashes.len(),
        o.crashes.join("\n")
    );
    let total: usize = o.counts.iter().sum();
    assert!(
        total >= 20.min(c.iters),
        "only {total} iterations ran in {:.0} s",
        o.secs
    );
    assert!(
        o.counts[1] > 0,
        "no damaged model was refused: is the damage reaching the file?"
    );
}

/// Seeded, time-bounded: damaged copies of the tiny model (1-4 changes each in metadata, tensor
/// infos and data offsets), each through `bmoe generate` (llama.cpp's own load) in a child.
#[test]
fn fuzz_damaged_models_never_crash() {
    let c = Campaign::from_env("qwen3moe", Mode::Resident, 1500, 60);
    if std::env::var("FUZZ_ARCHS").is_ok() {
        return; // `scripts/fuzz` runs its campaigns through `fuzz_every_architecture`.
    }
    assert_clean(&c, &c.run());
}

/// Every architecture's tiny model damaged and loaded both ways, the streamed lean load (where
/// the crashes were: issue 37) and llama.cpp's own. In CI a few dozen cases per architecture and
/// way (seeded); `scripts/fuzz` sets `FUZZ_ARCHS`, `FUZZ_MODES` and `FUZZ_ITERS` for long runs.
#[test]
fn fuzz_every_architecture() {
    let archs = std::env::var("FUZZ_ARCHS").unwrap_or_else(|_| SynthArch::NAMES.join(" "));
    let modes = std::env::var("FUZZ_MODES").unwrap_or_else(|_| "stream resident".into());
    let mut failed = Vec::new();
    for arch in archs.split_whitespace() {
        for mode in modes.split_whitespace().map(Mode::parse) {
            let iters = if mode == Mode::Stream { 80 } else { 40 };
            let c = Campaign::from_env(arch, mode, iters, 30);
            let o = c.run();
            if !o.crashes.is_empty() {
                failed.push(format!("{arch} {}:\n{}", mode.name(), o.crashes.join("\n")));
            } else {
                assert_clean(&c, &o);
            }
        }
    }
    assert!(failed.is_empty(), "crashes:\n{}", failed.join("\n"));
}

/// A config file damaged: one byte changed, a line dropped or doubled, a number swapped for an
/// extreme one.
fn damage_text(t: &str, rng: &mut Rng) -> String {
    let mut b = t.as_bytes().to_vec();
    match rng.below(4) {
        0 if !b.is_empty() => {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
        1 => {
            let lines: Vec<&str> = t.lines().collect();
            let k = rng.below(lines.len().max(1));
            return lines
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != k)
                .map(|(_, l)| format!("{l}\n"))
                .collect();
        }
        2 => {
            let lines: Vec<&str> = t.lines().collect();
            let k = rng.below(lines.len().max(1));
            return lines
                .iter()
                .enumerate()
                .flat_map(|(i, l)| if i == k { vec![*l, *l] } else { vec![*l] })
                .map(|l| format!("{l}\n"))
                .collect();
        }
        _ => {
            let s = String::from_utf8_lossy(&b).into_owned();
            let digits: Vec<usize> = s
                .char_indices()
                .filter(|(_, c)| c.is_ascii_digit())
                .map(|(i, _)| i)
                .collect();
            if let Some(&i) = digits.get(rng.below(digits.len().max(1))) {
                let extreme =
                    ["0", "-1", "99999999999999999999", "1e308", "nan", "\"\""][rng.below(6)];
                return format!("{}{}{}", &s[..i], extreme, &s[i + 1..]);
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Seeded, time-bounded: damaged profiles, jobs and JSONL decision lines through `bmoe check`.
#[test]
fn fuzz_damaged_configs_never_crash() {
    let seed: u64 = env_or("FUZZ_SEED", 15);
    let secs: u64 = env_or("FUZZ_CONFIG_SECS", 20);
    let iters: usize = env_or("FUZZ_CONFIG_ITERS", 300);
    if iters == 0 {
        return; // `scripts/fuzz --config-iterations 0`
    }
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 3);
    p.write("jobs/job.toml", common::DECIDE_JOB);
    let originals: Vec<(String, String)> = [
        "profiles/host.toml",
        "jobs/job.toml",
        "jobs/decisions.jsonl",
    ]
    .iter()
    .map(|f| (f.to_string(), p.read(f)))
    .collect();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut counts = [0usize; 3];
    let mut crashes = Vec::new();
    for i in 0..iters {
        if Instant::now() > deadline {
            break;
        }
        let mut rng = Rng::new(seed.wrapping_mul(7_919).wrapping_add(i as u64));
        let (f, orig) = &originals[rng.below(originals.len())];
        let damaged = damage_text(orig, &mut rng);
        p.write(f, &damaged);
        let o = p.bmoe(&["check", "jobs/job.toml", "--no-probe"]);
        let out = text(&o);
        let v = match o.status.code() {
            None => Verdict::Crash("signal".into()),
            Some(0) => Verdict::Ran,
            Some(1 | 2) if out.contains("error: ") && !out.contains("panicked") => Verdict::Refused,
            Some(c) => Verdict::Crash(format!("exit {c}")),
        };
        match v {
            Verdict::Ran => counts[0] += 1,
            Verdict::Refused => counts[1] += 1,
            Verdict::Crash(why) => {
                counts[2] += 1;
                crashes.push(format!(
                    "{f} (seed {seed}, iteration {i}): {why}\n{damaged}\n{out}"
                ));
            }
        }
        p.write(f, orig);
    }
    eprintln!(
        "fuzz configs: seed {seed}: {} checked ok, {} refused with an error, {} crashed",
        counts[0], counts[1], counts[2]
    );
    assert!(crashes.is_empty(), "{}", crashes.join("\n---\n"));
    assert!(counts[1] > 0);
}

/// Half-copied files: the tiny model cut short in the magic, the counts, the metadata, the tensor
/// infos and the data; each must be refused (never loaded, never a crash).
#[test]
fn truncated_copies_are_refused() {
    let b = tiny_bytes();
    let (_, header_end) = walk(&b).expect("walk");
    let dir = tempfile::tempdir().unwrap();
    let cuts = [
        0,
        3,
        4,
        8,
        16,
        23,
        header_end / 3,
        header_end / 2,
        header_end - 1,
        header_end,
        header_end + 1,
        b.len() / 2,
        b.len() - 1,
    ];
    for cut in cuts {
        let (v, out) = judge_model(&b[..cut], dir.path(), "cut.gguf");
        assert_eq!(v, Verdict::Refused, "cut at {cut} of {}: {out}", b.len());
    }
}

/// The structure-aware damage changes the file every time, and each case written as fixture text
/// reads back as the same patches (a crash it finds can be kept as a fixture).
#[test]
fn structural_damage_is_real_and_replayable() {
    let b = tiny_bytes();
    let l = layout(&b).expect("the tiny model's header lays out");
    assert_eq!(l.kvs.len(), 26);
    for i in 0..500 {
        let patches = mutate_structure(&b, &l, &mut Rng::new(i));
        assert!(!patches.is_empty());
        assert!(
            apply(&b, &patches) != b,
            "case {i} changed nothing: {patches:?}"
        );
        assert_eq!(parse_patches(&patches_text(&patches)), patches, "case {i}");
    }
}
