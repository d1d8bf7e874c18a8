//! Damaging GGUF files on purpose: a walker that maps a GGUF header's fields (counts, lengths,
//! types, values, tensor infos, data offsets) and a seeded mutator that changes 1-4 of them the
//! way a half-copied or hostile file would. Shared by the fuzz tests and the regression fixtures.
#![allow(dead_code)]
pub mod structure;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A splitmix64 stream: the same seed gives the same damage on every machine.
pub struct Rng(u64);

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    /// The next 64 bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// What a field of the header is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// n_tensors / n_kv / an array's element count.
    Count,
    /// A string's byte length.
    Len,
    /// A gguf value type or a ggml tensor type.
    Type,
    /// A scalar value or an array element (integer or float bits).
    Value,
    /// A tensor's number of dimensions or one of its dimensions.
    Dim,
    /// A tensor's data offset.
    Offset,
    /// The bytes of a string (a key, a tensor name, a string value such as a token).
    Text,
}

/// One field: where it is, how wide, what it is.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub off: usize,
    pub width: usize,
    pub kind: Kind,
}

fn rd(b: &[u8], off: usize, w: usize) -> Option<u64> {
    let s = b.get(off..off + w)?;
    let mut a = [0u8; 8];
    a[..w].copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

fn scalar_width(t: u64) -> Option<usize> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// Maps the header of a well-formed GGUF; returns the fields and the end of the tensor infos.
pub fn walk(b: &[u8]) -> Option<(Vec<Field>, usize)> {
    let mut f = Vec::new();
    let mut p = 8usize;
    let n_tensors = rd(b, p, 8)? as usize;
    f.push(Field {
        off: p,
        width: 8,
        kind: Kind::Count,
    });
    p += 8;
    let n_kv = rd(b, p, 8)? as usize;
    f.push(Field {
        off: p,
        width: 8,
        kind: Kind::Count,
    });
    p += 8;
    let string = |p: &mut usize, f: &mut Vec<Field>| -> Option<()> {
        let len = rd(b, *p, 8)? as usize;
        f.push(Field {
            off: *p,
            width: 8,
            kind: Kind::Len,
        });
        *p += 8;
        if len > 0 {
            f.push(Field {
                off: *p,
                width: len,
                kind: Kind::Text,
            });
        }
        *p += len;
        Some(())
    };
    for _ in 0..n_kv {
        string(&mut p, &mut f)?;
        let t = rd(b, p, 4)?;
        f.push(Field {
            off: p,
            width: 4,
            kind: Kind::Type,
        });
        p += 4;
        match t {
            8 => string(&mut p, &mut f)?,
            9 => {
                let et = rd(b, p, 4)?;
                f.push(Field {
                    off: p,
                    width: 4,
                    kind: Kind::Type,
                });
                p += 4;
                let n = rd(b, p, 8)? as usize;
                f.push(Field {
                    off: p,
                    width: 8,
                    kind: Kind::Count,
                });
                p += 8;
                if et == 8 {
                    for _ in 0..n {
                        string(&mut p, &mut f)?;
                    }
                } else {
                    let w = scalar_width(et)?;
                    for i in 0..n {
                        f.push(Field {
                            off: p + i * w,
                            width: w,
                            kind: Kind::Value,
                        });
                    }
                    p += n * w;
                }
            }
            t => {
                let w = scalar_width(t)?;
                f.push(Field {
                    off: p,
                    width: w,
                    kind: Kind::Value,
                });
                p += w;
            }
        }
    }
    for _ in 0..n_tensors {
        string(&mut p, &mut f)?;
        let nd = rd(b, p, 4)? as usize;
        f.push(Field {
            off: p,
            width: 4,
            kind: Kind::Dim,
        });
        p += 4;
        for _ in 0..nd {
            f.push(Field {
                off: p,
                width: 8,
                kind: Kind::Dim,
            });
            p += 8;
        }
        f.push(Field {
            off: p,
            width: 4,
            kind: Kind::Type,
        });
        p += 4;
        f.push(Field {
            off: p,
            width: 8,
            kind: Kind::Offset,
        });
        p += 8;
    }
    Some((f, p))
}

/// One change: write `bytes` over the bytes at `off`, or, with `remove`, replace that many bytes
/// at `off` with `bytes` (the file grows or shrinks: a key renamed, a pair removed, a cut).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub off: usize,
    pub bytes: Vec<u8>,
    pub remove: Option<usize>,
}

fn interesting(rng: &mut Rng, old: u64, width: usize) -> u64 {
    let bits = width * 8;
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let v = match rng.below(12) {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max >> 1,
        4 => (max >> 1) + 1,
        5 => old.wrapping_add(1),
        6 => old.wrapping_sub(1),
        7 => old.wrapping_mul(2),
        8 => old / 2,
        9 => 1u64 << rng.below(bits),
        10 => rng.below(300) as u64,
        _ => rng.next(),
    };
    v & max
}

/// 1-4 seeded changes to the header `b` described by `fields`; the patches, in order.
pub fn mutate(b: &[u8], fields: &[Field], header_end: usize, rng: &mut Rng) -> Vec<Patch> {
    let n = 1 + rng.below(4);
    let mut out = Vec::new();
    for _ in 0..n {
        let patch = match rng.below(12) {
            // A type field set to any ggml/gguf type number (a tensor typed i32, an array of
            // bools): types are small enums, rarely hit by the integer values below.
            10 | 11 => {
                let types: Vec<&Field> = fields.iter().filter(|f| f.kind == Kind::Type).collect();
                let f = types[rng.below(types.len())];
                let v = rng.below(42) as u64;
                Patch {
                    off: f.off,
                    bytes: v.to_le_bytes()[..f.width].to_vec(),
                    remove: None,
                }
            }
            // A random byte anywhere in the header (metadata and tensor infos).
            0 | 1 => {
                let off = rng.below(header_end);
                Patch {
                    off,
                    bytes: vec![rng.next() as u8],
                    remove: None,
                }
            }
            // A string's bytes: one byte changed, or another string of the same length copied
            // over it (two equal token strings, two equal keys or names).
            2 | 3 => {
                let texts: Vec<&Field> = fields.iter().filter(|f| f.kind == Kind::Text).collect();
                let f = texts[rng.below(texts.len())];
                if rng.below(2) == 0 {
                    let same: Vec<&&Field> = texts
                        .iter()
                        .filter(|g| g.width == f.width && g.off != f.off)
                        .collect();
                    if let Some(g) = same.get(rng.below(same.len().max(1))) {
                        Patch {
                            off: f.off,
                            bytes: b[g.off..g.off + g.width].to_vec(),
                            remove: None,
                        }
                    } else {
                        Patch {
                            off: f.off + rng.below(f.width),
                            bytes: vec![rng.next() as u8],
                            remove: None,
                        }
                    }
                } else {
                    Patch {
                        off: f.off + rng.below(f.width),
                        bytes: vec![rng.next() as u8],
                        remove: None,
                    }
                }
            }
            // An integer at its width: counts, lengths, types, values, dims, offsets.
            _ => {
                let ints: Vec<&Field> = fields.iter().filter(|f| f.kind != Kind::Text).collect();
                let f = ints[rng.below(ints.len())];
                let old = rd(b, f.off, f.width).unwrap_or(0);
                let v = interesting(rng, old, f.width);
                Patch {
                    off: f.off,
                    bytes: v.to_le_bytes()[..f.width].to_vec(),
                    remove: None,
                }
            }
        };
        out.push(patch);
    }
    out
}

/// `b` with `patches` applied in order (an overwrite's past-the-end bytes are dropped).
pub fn apply(b: &[u8], patches: &[Patch]) -> Vec<u8> {
    let mut d = b.to_vec();
    for p in patches {
        match p.remove {
            None => {
                for (i, &x) in p.bytes.iter().enumerate() {
                    if let Some(slot) = d.get_mut(p.off + i) {
                        *slot = x;
                    }
                }
            }
            Some(n) => {
                let at = p.off.min(d.len());
                let end = at.saturating_add(n).min(d.len());
                d.splice(at..end, p.bytes.iter().copied());
            }
        }
    }
    d
}

/// Patches as fixture text: `offset hex` per overwrite, `offset..end hex` per splice (`-` for
/// no bytes).
pub fn patches_text(patches: &[Patch]) -> String {
    patches
        .iter()
        .map(|p| {
            let hex: String = p.bytes.iter().map(|b| format!("{b:02x}")).collect();
            match p.remove {
                None => format!("{} {hex}\n", p.off),
                Some(n) if hex.is_empty() => format!("{}..{} -\n", p.off, p.off + n),
                Some(n) => format!("{}..{} {hex}\n", p.off, p.off + n),
            }
        })
        .collect()
}

/// Parses fixture text: `offset hex` and `offset..end hex|-` lines, `#` comments.
pub fn parse_patches(text: &str) -> Vec<Patch> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (at, hex) = l.split_once(' ').expect("`offset hex`");
            let hex = if hex == "-" { "" } else { hex };
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            let (off, remove) = match at.split_once("..") {
                Some((a, e)) => {
                    let (a, e): (usize, usize) =
                        (a.parse().expect("offset"), e.parse().expect("end"));
                    (a, Some(e - a))
                }
                None => (at.parse().expect("offset"), None),
            };
            Patch { off, bytes, remove }
        })
        .collect()
}

/// How one child run ended, judged.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Ran (exit 0).
    Ran,
    /// Refused with a clear `error:` line (exit 1).
    Refused,
    /// A crash: a signal, a panic, a timeout, or a failure without an `error:` line.
    Crash(String),
}

/// Runs `bmoe args...` with a time limit and judges it.
pub fn run_judged(bin: &Path, args: &[&str], limit: Duration) -> (Verdict, Output) {
    run_judged_with(bin, args, &[], limit)
}

/// [`run_judged`] with `env` set for the child (the engine's device fuzz drives its own test
/// binary as the child).
pub fn run_judged_with(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Verdict, Output) {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("BMOE_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd
        .args(args)
        .env("GGML_NO_BACKTRACE", "1")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bmoe");
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            return (Verdict::Crash(format!("hung for {limit:?}")), o);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&o.stderr);
    let v = match o.status.code() {
        None => Verdict::Crash(format!("killed by a signal ({:?})", o.status)),
        Some(0) => Verdict::Ran,
        Some(101) => Verdict::Crash("panicked (exit 101)".into()),
        _ if err.contains("panicked") => Verdict::Crash("panicked".into()),
        Some(1 | 2) if err.lines().any(|l| l.starts_with("error: ")) => Verdict::Refused,
        Some(c) => Verdict::Crash(format!("exit {c} without an `error:` line")),
    };
    (v, o)
}
