//! Damage that understands GGUF: where [`super::mutate`] changes a field's bytes in place, these
//! change the file's structure the way a broken converter or a hostile file would: a key renamed
//! (empty, a NUL byte inside, not UTF-8, another key's name, too long), a key-value pair removed or
//! doubled, a value retyped with its bytes re-encoded (a scalar as a string, an array of arrays),
//! an array one element longer or shorter, a tensor renamed, given a dimension more or fewer, or
//! pointed at another tensor's data, and the file cut at a field boundary.
use super::{Patch, Rng};

/// One key-value pair of the header: where it starts, its key's text, its value, its end.
#[derive(Debug, Clone)]
pub struct KvSpan {
    pub start: usize,
    pub key: std::ops::Range<usize>,
    pub ty_off: usize,
    pub end: usize,
    pub ty: u32,
    /// For an array: (element type, count offset, first element offset, element count).
    pub array: Option<(u32, usize, usize, u64)>,
}

/// One tensor info: its start, name, dims, type and offset fields, its end.
#[derive(Debug, Clone)]
pub struct TensorSpan {
    pub start: usize,
    pub name: std::ops::Range<usize>,
    pub n_dims_off: usize,
    pub n_dims: usize,
    pub ty_off: usize,
    pub offset_off: usize,
    pub end: usize,
}

/// A well-formed GGUF header, pair by pair and tensor by tensor.
#[derive(Debug, Clone)]
pub struct Layout {
    pub kvs: Vec<KvSpan>,
    pub tensors: Vec<TensorSpan>,
    /// The end of the tensor infos (the data section starts at the next alignment).
    pub end: usize,
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn value_end(b: &[u8], ty: u32, p: usize) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => p + 1,
        2 | 3 => p + 2,
        4..=6 => p + 4,
        10..=12 => p + 8,
        8 => p + 8 + u64_at(b, p)? as usize,
        _ => return None,
    })
}

/// Maps the header of a well-formed GGUF.
pub fn layout(b: &[u8]) -> Option<Layout> {
    let (n_tensors, n_kv) = (u64_at(b, 8)? as usize, u64_at(b, 16)? as usize);
    let mut p = 24;
    let mut kvs = Vec::with_capacity(n_kv);
    for _ in 0..n_kv {
        let start = p;
        let len = u64_at(b, p)? as usize;
        let key = p + 8..p + 8 + len;
        p = key.end;
        let ty = u32_at(b, p)?;
        let ty_off = p;
        p += 4;
        let mut array = None;
        if ty == 9 {
            let et = u32_at(b, p)?;
            let n = u64_at(b, p + 4)?;
            array = Some((et, p + 4, p + 12, n));
            p += 12;
            for _ in 0..n {
                p = value_end(b, et, p)?;
            }
        } else {
            p = value_end(b, ty, p)?;
        }
        kvs.push(KvSpan {
            start,
            key,
            ty_off,
            end: p,
            ty,
            array,
        });
    }
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let start = p;
        let len = u64_at(b, p)? as usize;
        let name = p + 8..p + 8 + len;
        p = name.end;
        let n_dims = u32_at(b, p)? as usize;
        let n_dims_off = p;
        p += 4 + 8 * n_dims;
        let ty_off = p;
        let offset_off = p + 4;
        p += 12;
        tensors.push(TensorSpan {
            start,
            name,
            n_dims_off,
            n_dims,
            ty_off,
            offset_off,
            end: p,
        });
    }
    (p <= b.len()).then_some(Layout {
        kvs,
        tensors,
        end: p,
    })
}

fn gguf_string(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

fn splice(off: usize, remove: usize, bytes: Vec<u8>) -> Patch {
    Patch {
        off,
        bytes,
        remove: Some(remove),
    }
}

fn overwrite(off: usize, bytes: Vec<u8>) -> Patch {
    Patch {
        off,
        bytes,
        remove: None,
    }
}

/// A new name for a key or tensor whose name is `old`: the ways names go wrong.
fn bad_name(b: &[u8], old: &[u8], others: &[std::ops::Range<usize>], rng: &mut Rng) -> Vec<u8> {
    match rng.below(8) {
        0 => Vec::new(),
        1 => [b"\0".as_slice(), old].concat(),
        2 => {
            let cut = rng.below(old.len().max(1));
            [&old[..cut], b"\0", &old[cut..]].concat()
        }
        3 => [old, b"\xff\xfe"].concat(),
        4 => vec![b'k'; 64 + rng.below(200)],
        5 => old[..rng.below(old.len().max(1))].to_vec(),
        // Another entry's name: a duplicate.
        _ => others
            .get(rng.below(others.len().max(1)))
            .map_or_else(Vec::new, |r| b[r.clone()].to_vec()),
    }
}

/// A value of type `ty` (a scalar's bytes, or a string).
fn some_value(ty: u32, rng: &mut Rng) -> Vec<u8> {
    let x = rng.next();
    match ty {
        8 => gguf_string(&x.to_string().into_bytes()[..rng.below(8)]),
        0 | 1 | 7 => vec![x as u8],
        2 | 3 => (x as u16).to_le_bytes().to_vec(),
        4..=6 => (x as u32).to_le_bytes().to_vec(),
        _ => x.to_le_bytes().to_vec(),
    }
}

fn set_count(off: usize, n: u64) -> Patch {
    overwrite(off, n.to_le_bytes().to_vec())
}

/// A pair's key renamed.
fn rename_key(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let kv = &l.kvs[rng.below(l.kvs.len())];
    let others: Vec<_> = l
        .kvs
        .iter()
        .map(|k| k.key.clone())
        .filter(|k| *k != kv.key)
        .collect();
    let name = bad_name(b, &b[kv.key.clone()], &others, rng);
    vec![splice(kv.start, kv.key.end - kv.start, gguf_string(&name))]
}

/// A pair removed or doubled, the count kept or made to agree.
fn drop_or_double_kv(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let kv = &l.kvs[rng.below(l.kvs.len())];
    let n = l.kvs.len() as u64;
    let (edit, n) = if rng.below(2) == 0 {
        (splice(kv.start, kv.end - kv.start, Vec::new()), n - 1)
    } else {
        (splice(kv.end, 0, b[kv.start..kv.end].to_vec()), n + 1)
    };
    let mut out = vec![edit];
    if rng.below(4) != 0 {
        out.push(set_count(16, n));
    }
    out
}

/// A value retyped, its bytes re-encoded for the new type (a number as a string, a scalar as an
/// array of one, an array whose elements are arrays).
fn retype_value(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let kv = &l.kvs[rng.below(l.kvs.len())];
    let value = kv.ty_off..kv.end;
    let new = match rng.below(3) {
        0 => {
            let ty = [0u32, 4, 5, 6, 7, 8, 10, 12][rng.below(8)];
            [ty.to_le_bytes().to_vec(), some_value(ty, rng)].concat()
        }
        1 => {
            let ty = if kv.ty == 9 { 4 } else { kv.ty };
            let mut v = 9u32.to_le_bytes().to_vec();
            v.extend(ty.to_le_bytes());
            v.extend(1u64.to_le_bytes());
            v.extend(some_value(ty, rng));
            v
        }
        _ => {
            // An array of arrays (GGUF has none; ggml's reader must refuse it).
            let mut v = 9u32.to_le_bytes().to_vec();
            v.extend(9u32.to_le_bytes());
            v.extend(1u64.to_le_bytes());
            v.extend(b[kv.ty_off..kv.end].to_vec());
            v
        }
    };
    vec![splice(value.start, value.len(), new)]
}

/// An array one element shorter or longer (or emptied), its count made to agree or not.
fn resize_array(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let arrays: Vec<&KvSpan> = l.kvs.iter().filter(|k| k.array.is_some()).collect();
    let Some(kv) = arrays.get(rng.below(arrays.len().max(1))) else {
        return rename_key(b, l, rng);
    };
    let (et, count_off, first, n) = kv.array.expect("an array");
    let mut out = Vec::new();
    let new_n = match rng.below(3) {
        0 if n > 0 => {
            let last_start = (0..n - 1).try_fold(first, |p, _| value_end(b, et, p));
            let last_start = last_start.unwrap_or(first);
            out.push(splice(last_start, kv.end - last_start, Vec::new()));
            n - 1
        }
        1 => {
            out.push(splice(kv.end, 0, some_value(et, rng)));
            n + 1
        }
        _ => {
            out.push(splice(first, kv.end - first, Vec::new()));
            0
        }
    };
    if rng.below(4) != 0 {
        out.push(set_count(count_off, new_n));
    }
    out
}

/// A tensor renamed, given a dimension more or fewer, or pointed at another tensor's data.
fn damage_tensor(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let t = &l.tensors[rng.below(l.tensors.len())];
    match rng.below(3) {
        0 => {
            let others: Vec<_> = l
                .tensors
                .iter()
                .map(|o| o.name.clone())
                .filter(|o| *o != t.name)
                .collect();
            let name = bad_name(b, &b[t.name.clone()], &others, rng);
            vec![splice(t.start, t.name.end - t.start, gguf_string(&name))]
        }
        1 => {
            let dims_end = t.n_dims_off + 4 + 8 * t.n_dims;
            if rng.below(2) == 0 && t.n_dims > 0 {
                vec![
                    splice(dims_end - 8, 8, Vec::new()),
                    overwrite(t.n_dims_off, ((t.n_dims - 1) as u32).to_le_bytes().to_vec()),
                ]
            } else {
                let dim = [0u64, 1, 2, 3, 64, u64::MAX][rng.below(6)];
                vec![
                    splice(dims_end, 0, dim.to_le_bytes().to_vec()),
                    overwrite(t.n_dims_off, ((t.n_dims + 1) as u32).to_le_bytes().to_vec()),
                ]
            }
        }
        _ => {
            // Another tensor's data (its offset differs: tensors do not share data).
            let others: Vec<&TensorSpan> = l
                .tensors
                .iter()
                .filter(|o| b[o.offset_off..o.offset_off + 8] != b[t.offset_off..t.offset_off + 8])
                .collect();
            let Some(other) = others.get(rng.below(others.len().max(1))) else {
                return cut_at_boundary(b, l, rng);
            };
            vec![overwrite(
                t.offset_off,
                b[other.offset_off..other.offset_off + 8].to_vec(),
            )]
        }
    }
}

/// The file cut at a field boundary: inside the pairs, inside the tensor infos, at the data.
fn cut_at_boundary(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let mut bounds: Vec<usize> = vec![8, 16, 24, l.end];
    bounds.extend(
        l.kvs
            .iter()
            .flat_map(|k| [k.start, k.key.end, k.ty_off + 4]),
    );
    bounds.extend(
        l.tensors
            .iter()
            .flat_map(|t| [t.start, t.name.end, t.offset_off]),
    );
    bounds.push(l.end + rng.below(b.len().saturating_sub(l.end).max(1)));
    let at = bounds[rng.below(bounds.len())].min(b.len());
    vec![splice(at, b.len() - at, Vec::new())]
}

/// One structural change to the well-formed GGUF `b`, as patches to apply in order (each later
/// one lies before the earlier ones, so no offset moves under another).
pub fn mutate_structure(b: &[u8], l: &Layout, rng: &mut Rng) -> Vec<Patch> {
    let mut p = match rng.below(12) {
        0..=2 => rename_key(b, l, rng),
        3 | 4 => drop_or_double_kv(b, l, rng),
        5 | 6 => retype_value(b, l, rng),
        7 | 8 => resize_array(b, l, rng),
        9 | 10 => damage_tensor(b, l, rng),
        _ => cut_at_boundary(b, l, rng),
    };
    p.sort_by_key(|q| std::cmp::Reverse(q.off));
    p
}
