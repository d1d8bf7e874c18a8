//! A bounds-checked walk over a GGUF header, for what ggml's reader does not say when it stops at
//! the end of a file: which key-value pair or tensor info ran past it. ggml logs only the section
//! ("failed to read tensor info"); a file cut short, or a count or length that claims more than the
//! file holds, then gets an error that names the item.
use std::io::{BufReader, Read, Seek};
use std::path::Path;

/// Bytes of each fixed-size GGUF value type (`gguf_type`), by tag.
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

const U32: u32 = 4;
const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// A reader that knows where it is and how long the file is.
struct Cursor<R> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read + Seek> Cursor<R> {
    /// Fails naming `what` where `n` more bytes are not in the file.
    fn need(&self, n: u64, what: &str) -> Result<(), String> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(format!(
                "{what}: {n} bytes at byte {}, but the file ends at byte {}",
                self.pos, self.len
            )),
        }
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, String> {
        self.need(n, what)?;
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("{what}: {e}"))?;
        self.pos += n;
        Ok(b)
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), String> {
        self.need(n, what)?;
        let by = i64::try_from(n).map_err(|_| format!("{what}: {n} bytes"))?;
        self.r
            .seek_relative(by)
            .map_err(|e| format!("{what}: {e}"))?;
        self.pos += n;
        Ok(())
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.bytes(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    /// A GGUF string: its length, then its bytes (kept only when `keep`).
    fn string(&mut self, what: &str, keep: bool) -> Result<String, String> {
        let n = self.u64(&format!("{what}'s length"))?;
        if keep && n <= 4096 {
            let b = self.bytes(n, what)?;
            return Ok(String::from_utf8_lossy(&b).into_owned());
        }
        self.skip(n, &format!("{what} ({n} bytes)"))?;
        Ok(String::new())
    }

    /// A value of type `ty` (an array's elements each in turn; ggml has no arrays of arrays).
    fn value(&mut self, ty: u32, what: &str) -> Result<(), String> {
        if let Some(n) = fixed_size(ty) {
            return self.skip(n, what);
        }
        match ty {
            STRING => self.string(what, false).map(drop),
            ARRAY => {
                let et = self.u32(&format!("{what}'s element type"))?;
                let n = self.u64(&format!("{what}'s element count"))?;
                if let Some(size) = fixed_size(et) {
                    let total = n.saturating_mul(size);
                    return self.skip(total, &format!("{what}'s {n} elements"));
                }
                if et != STRING {
                    return Err(format!("{what} is an array of type {et}"));
                }
                for i in 0..n {
                    self.string(&format!("{what}'s element {i} of {n}"), false)?;
                }
                Ok(())
            }
            _ => Err(format!("{what} has type {ty}, not a GGUF type")),
        }
    }
}

/// Where a GGUF header that ggml could not read stops making sense: the key-value pair or tensor
/// info (by number and, where it was read, name) that runs past the end of the file or has a
/// type GGUF lacks. `None` where the header walks to its end (ggml stopped for another reason)
/// or the file cannot be read.
pub(crate) fn header_problem(path: &Path) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let mut c = Cursor {
        r: BufReader::new(f),
        pos: 0,
        len,
    };
    walk(&mut c).err()
}

fn walk<R: Read + Seek>(c: &mut Cursor<R>) -> Result<(), String> {
    c.skip(8, "the magic and version")?;
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the key-value count")?;
    let mut last = String::new();
    let mut align = 32;
    for i in 0..n_kv {
        let at = |what: &str, last: &str| {
            let after = if last.is_empty() {
                String::new()
            } else {
                format!(", after '{last}'")
            };
            format!("key-value pair {i} of {n_kv}{after}: {what}")
        };
        let key = c.string(&at("its key", &last), true)?;
        let ty = c.u32(&format!("key '{key}' (pair {i} of {n_kv}): its type"))?;
        let what = format!("key '{key}' (pair {i} of {n_kv}): its value");
        if key == "general.alignment" && ty == U32 {
            align = u64::from(c.u32(&what)?);
        } else {
            c.value(ty, &what)?;
        }
        last = key;
    }
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor info {i} of {n_tensors}: its name"), true)?;
        let what = format!("tensor '{name}' (info {i} of {n_tensors})");
        let n_dims = c.u32(&format!("{what}: its number of dimensions"))?;
        let dims = u64::from(n_dims).saturating_mul(8);
        c.skip(dims, &format!("{what}: its {n_dims} dimensions"))?;
        c.skip(12, &format!("{what}: its type and offset"))?;
    }
    // ggml seeks to the data section, the header's end rounded up to the alignment.
    let start = c.pos.div_ceil(align.max(1)).saturating_mul(align.max(1));
    if start > c.len {
        return Err(format!(
            "the data section: it starts at byte {start} (the header's end, {}, aligned to {align}) \
             but the file ends at byte {}",
            c.pos, c.len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A header of `kv` (key, string value) pairs and one 1-D f32 tensor `t`.
    fn header(kv: &[(&str, &str)], n_tensors_claimed: u64) -> Vec<u8> {
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors_claimed.to_le_bytes());
        b.extend((kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            s(&mut b, k);
            b.extend(STRING.to_le_bytes());
            s(&mut b, v);
        }
        s(&mut b, "t");
        b.extend(1u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b
    }

    fn problem(b: &[u8]) -> Option<String> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b).unwrap();
        header_problem(f.path())
    }

    /// `header` with its data section: padded to 32 bytes, then the tensor's 4 bytes.
    fn whole(h: &[u8]) -> Vec<u8> {
        let mut b = h.to_vec();
        b.resize(h.len().div_ceil(32) * 32 + 4, 0);
        b
    }

    #[test]
    fn names_the_item_that_runs_past_the_end() {
        let h = header(&[("general.name", "tiny"), ("general.x", "abc")], 1);
        assert_eq!(problem(&whole(&h)), None);
        // The header whole, but the file ends before the aligned start of the data section.
        assert_ne!(h.len() % 32, 0);
        let p = problem(&h).unwrap();
        assert!(p.starts_with("the data section: it starts at byte"), "{p}");
        // Cut inside the second pair's value.
        let cut = h.len() - 33 - 2;
        let p = problem(&h[..cut]).unwrap();
        assert!(
            p.starts_with("key 'general.x' (pair 1 of 2): its value"),
            "{p}"
        );
        assert!(p.ends_with(&format!("the file ends at byte {cut}")), "{p}");
        // A tensor count that claims more than the file holds.
        let p = problem(&whole(&header(&[("general.name", "tiny")], 3))).unwrap();
        assert!(
            p.starts_with("tensor info 1 of 3: its name's length"),
            "{p}"
        );
        // A string length past the end, and an unknown type.
        let mut b = whole(&header(&[("general.name", "tiny")], 1));
        b[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
        let p = problem(&b).unwrap();
        assert!(
            p.contains("key 'general.name' (pair 0 of 1): its value"),
            "{p}"
        );
        let mut b = whole(&header(&[("general.name", "tiny")], 1));
        b[44..48].copy_from_slice(&77u32.to_le_bytes());
        let p = problem(&b).unwrap();
        assert!(p.contains("has type 77, not a GGUF type"), "{p}");
    }
}
