//! Where every tensor of a GGUF lives: tensor name -> (shard file, absolute offset, size), split
//! GGUFs (`-00001-of-0000N`) included, checked against the files' real lengths.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::ffi::gguf::{GgufFile, TensorInfo};
use crate::model::check_gguf_file;

/// One tensor's bytes on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLocation {
    /// Index into [`GgufIndex::files`].
    pub file: usize,
    /// Absolute byte offset in that file.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// The tensor table of a (possibly split) GGUF.
pub struct GgufIndex {
    files: Vec<(PathBuf, u64)>,
    tensors: HashMap<String, TensorLocation>,
    /// Every tensor's type and shape, all shards.
    infos: Vec<TensorInfo>,
    first: GgufFile,
}

/// The shard paths of a split GGUF named like `name-00001-of-00003.gguf`, or `None`.
fn split_paths(path: &Path, count: u32) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (prefix, tail) = stem.rsplit_once("-of-")?;
    let (prefix, _) = prefix.rsplit_once('-')?;
    let width = tail.len();
    Some(
        (1..=count)
            .map(|i| path.with_file_name(format!("{prefix}-{i:0width$}-of-{count:0width$}.gguf")))
            .collect(),
    )
}

impl GgufIndex {
    /// Indexes `path` and, for a split GGUF, every shard; a missing shard or a tensor past the end
    /// of its file is an error.
    pub fn open(path: &Path) -> Result<Self> {
        let len = check_gguf_file(path)?;
        let first = GgufFile::open(path).map_err(|reason| EngineError::ModelLoad {
            path: path.to_path_buf(),
            reason: format!("unreadable GGUF header: {reason}"),
        })?;
        let count = match first.get_i64("split.count") {
            None => 1,
            // The shard names carry the count in five digits (`-00001-of-00003`).
            Some(c @ 1..=99_999) => c as u32,
            Some(c) => {
                return Err(EngineError::Invalid {
                    path: path.to_path_buf(),
                    what: format!("split.count = {c}: expected 1..=99999 shards"),
                })
            }
        };
        let mut paths = vec![path.to_path_buf()];
        if count > 1 {
            paths = split_paths(path, count).ok_or_else(|| EngineError::ModelLoad {
                path: path.to_path_buf(),
                reason: format!(
                    "the file says it is shard of a {count}-way split, but its name does not follow <name>-00001-of-{count:05}.gguf"
                ),
            })?;
            for (i, p) in paths.iter().enumerate() {
                if !p.exists() {
                    return Err(EngineError::MissingShard {
                        path: path.to_path_buf(),
                        shard: i as u32 + 1,
                        count,
                        missing: p.clone(),
                    });
                }
            }
        }
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        let mut infos = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let (len, header) = if i == 0 && p == path {
                (len, None)
            } else {
                let len = check_gguf_file(p)?;
                let g = GgufFile::open(p).map_err(|reason| EngineError::ModelLoad {
                    path: p.clone(),
                    reason: format!("unreadable GGUF header: {reason}"),
                })?;
                (len, Some(g))
            };
            let g = header.as_ref().unwrap_or(&first);
            if count > 1 {
                let no = g.get_i64("split.count");
                let idx = g.get_i64("split.no");
                if no != Some(i64::from(count)) || idx != Some(i as i64) {
                    return Err(EngineError::Invalid {
                        path: p.clone(),
                        what: format!(
                            "shard {} of {count}: split.no = {}, split.count = {}: expected split.no = {i} and split.count = {count}",
                            i + 1,
                            idx.map(|v| v.to_string()).unwrap_or_else(|| "(absent)".into()),
                            no.map(|v| v.to_string()).unwrap_or_else(|| "(absent)".into()),
                        ),
                    });
                }
            }
            infos.extend(g.tensor_infos());
            let base = g.data_offset();
            for (name, off, size) in g.tensors() {
                let end = base.saturating_add(off).saturating_add(size);
                if end > len {
                    return Err(EngineError::ModelLoad {
                        path: p.clone(),
                        reason: format!(
                            "the file is truncated: tensor {name} ends at byte {end} but the file has {len} bytes"
                        ),
                    });
                }
                tensors.insert(
                    name,
                    TensorLocation {
                        file: i,
                        offset: base + off,
                        size,
                    },
                );
            }
            files.push((p.clone(), len));
        }
        if count > 1 {
            if let Some(want) = first.get_i64("split.tensors.count") {
                if want != tensors.len() as i64 {
                    return Err(EngineError::Invalid {
                        path: path.to_path_buf(),
                        what: format!(
                            "split.tensors.count = {want}: the {count} shards hold {} tensors",
                            tensors.len()
                        ),
                    });
                }
            }
        }
        Ok(Self {
            files,
            tensors,
            infos,
            first,
        })
    }

    /// The shard files and their lengths.
    pub fn files(&self) -> &[(PathBuf, u64)] {
        &self.files
    }

    /// Bytes of all shards.
    pub fn total_file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, l)| l).sum()
    }

    /// Every tensor's name, type and shape, all shards, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.infos
    }

    /// Where a tensor lives.
    pub fn get(&self, name: &str) -> Option<&TensorLocation> {
        self.tensors.get(name)
    }

    /// Tensors indexed.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Option<String> {
        self.first.get_str("general.architecture")
    }

    /// The first shard's header.
    pub fn header(&self) -> &GgufFile {
        &self.first
    }

    /// An integer metadata value of the first shard.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.first.get_u64(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = split_paths(Path::new("/m/x-00001-of-00003.gguf"), 3).unwrap();
        assert_eq!(p[2], PathBuf::from("/m/x-00003-of-00003.gguf"));
        assert!(split_paths(Path::new("/m/x.gguf"), 3).is_none());
    }
}
