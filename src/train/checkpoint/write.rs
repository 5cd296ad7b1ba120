//! Writing a checkpoint as a stream: one tensor at a time from where its values already live,
//! never the whole file in memory.
//!
//! Why: serialising with `safetensors::serialize` builds the whole file in one buffer, and the
//! tensors had first been copied out of the net into PyTorch's layout. For resnet18 those two
//! copies of the weights and the momentum were 178 MiB of a training run's peak at every
//! epoch's end. Here the header is built with the safetensors crate's own types
//! (`Metadata`, `TensorInfo`), the tensors follow in the order `safetensors::serialize` would
//! put them (type, then name), each converted into one reused buffer as it is written and
//! hashed on its way to the file; the checksum's placeholder in the header is then overwritten
//! with the digest. The file is the one `safetensors::serialize` would have written, byte for
//! byte in its data section (a test checks it), with the header's metadata in key order (so
//! the same run writes the same bytes), and it goes through [`AtomicFile`]: a temporary file,
//! fsynced, renamed into place.

use crate::nn::TensorInfo;
use crate::output::{AtomicFile, OutputError};
use safetensors::tensor::{Dtype, Metadata};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// Metadata key of the SHA-256 (lower-case hex) of the tensor data.
pub const CHECKSUM_KEY: &str = "tensor_sha256";

/// What the checksum's value is while the data is serialised: as long as the hex digest that
/// replaces it, so no offset in the header moves.
const CHECKSUM_PLACEHOLDER: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// Where the checksum placeholder's value starts in serialised bytes: after the header's
/// `"tensor_sha256":"` key (its quotes unescaped, so no other metadata value can hold it).
fn checksum_placeholder_at(bytes: &[u8]) -> Option<usize> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = bytes.get(8..8usize.checked_add(n)?)?;
    let key = format!("\"{CHECKSUM_KEY}\":\"{CHECKSUM_PLACEHOLDER}\"");
    let at = header
        .windows(key.len())
        .position(|w| w == key.as_bytes())?;
    Some(8 + at + key.len() - 1 - CHECKSUM_PLACEHOLDER.len())
}

/// `data`'s little-endian bytes: the values' own memory on a little-endian machine.
fn le_bytes(data: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: any f32's 4 bytes are valid u8s, u8 has alignment 1, and the slice covers
        // exactly `data`'s memory, borrowed for `data`'s lifetime.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
        std::borrow::Cow::Borrowed(bytes)
    } else {
        data.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

/// Why a checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// The header could not be built (the message says why).
    #[error("cannot serialise checkpoint: {0}")]
    Serialise(String),
    /// The file could not be written (the output rules' message).
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// Where one tensor's values come from when it is written.
pub(super) enum Values<'a> {
    /// Floats already in PyTorch's layout.
    Torch(&'a [f32]),
    /// Floats in our layout, converted to PyTorch's as they are written.
    Ours(&'a TensorInfo, &'a [f32]),
    /// An int64 counter (BatchNorm's `num_batches_tracked`).
    Counter(i64),
}

/// One tensor of a checkpoint being written: its name, PyTorch shape and values.
pub(super) struct Entry<'a> {
    /// The `state_dict` name.
    pub name: String,
    /// PyTorch's shape (empty for a counter).
    pub shape: &'a [usize],
    /// The values.
    pub values: Values<'a>,
}

impl Entry<'_> {
    fn dtype(&self) -> Dtype {
        match self.values {
            Values::Counter(_) => Dtype::I64,
            Values::Torch(_) | Values::Ours(..) => Dtype::F32,
        }
    }

    fn byte_len(&self) -> usize {
        match &self.values {
            Values::Counter(_) => 8,
            Values::Torch(v) => v.len() * 4,
            Values::Ours(t, _) => t.len * 4,
        }
    }

    /// Feeds this tensor's little-endian bytes to `sink`, converting through `scratch` when
    /// the values are in our layout.
    fn emit(
        &self,
        scratch: &mut Vec<f32>,
        sink: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        match &self.values {
            Values::Counter(x) => sink(&x.to_le_bytes()),
            Values::Torch(v) => sink(&le_bytes(v)),
            Values::Ours(t, ours) => {
                scratch.clear();
                scratch.resize(t.len, 0.0);
                t.to_torch(ours, scratch);
                sink(&le_bytes(scratch))
            }
        }
    }
}

/// The safetensors header (its 8-byte length, then the JSON padded with spaces to a multiple
/// of 8, as the crate pads it) for `entries` in their order, the checksum a placeholder.
fn header(
    entries: &[Entry<'_>],
    mut metadata: HashMap<String, String>,
) -> Result<Vec<u8>, WriteError> {
    metadata.insert(CHECKSUM_KEY.into(), CHECKSUM_PLACEHOLDER.into());
    let mut offset = 0;
    let infos = entries
        .iter()
        .map(|e| {
            let n = e.byte_len();
            let info = safetensors::tensor::TensorInfo {
                dtype: e.dtype(),
                shape: e.shape.to_vec(),
                data_offsets: (offset, offset + n),
            };
            offset += n;
            (e.name.clone(), info)
        })
        .collect();
    let unserialisable = |e: &dyn std::fmt::Display| WriteError::Serialise(e.to_string());
    // The crate checks the tensors (offsets, shapes) and writes them; the metadata goes in
    // first, in key order: the crate writes its `HashMap` in the map's own random order, so
    // two runs of the same seed wrote different bytes for the same checkpoint.
    let tensors = Metadata::new(None, infos).map_err(|e| unserialisable(&e))?;
    let tensors = serde_json::to_vec(&tensors).map_err(|e| unserialisable(&e))?;
    let sorted: std::collections::BTreeMap<_, _> = metadata.into_iter().collect();
    let mut json = b"{\"__metadata__\":".to_vec();
    serde_json::to_writer(&mut json, &sorted).map_err(|e| unserialisable(&e))?;
    match tensors.strip_prefix(b"{") {
        Some(b"}") => json.push(b'}'),
        Some(rest) => {
            json.push(b',');
            json.extend_from_slice(rest);
        }
        None => return Err(unserialisable(&"the tensors' header is not a JSON object")),
    }
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = Vec::with_capacity(8 + json.len());
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    Ok(bytes)
}

/// A checkpoint dptrain wrote, of any format version: its header's metadata names the
/// format. The metadata comes first; in checkpoints written before its keys were sorted, the
/// model file's text (at most 8 MiB) may come before the format, hence the head.
pub const CHECKPOINT_FILE: crate::output::Kind = crate::output::Kind {
    what: "a checkpoint dptrain wrote",
    head: 10 << 20,
    is_one: |head| crate::output::holds(head, b"\"format\":\"dptrain-checkpoint-"),
};

/// Writes `entries` with `metadata` to `path` atomically as a safetensors file whose header
/// holds the SHA-256 of its data section. With `slow`, the write pauses between tensors for
/// about two seconds in all, so a test can kill the process in the middle of it.
pub(super) fn write(
    path: &Path,
    mut entries: Vec<Entry<'_>>,
    metadata: HashMap<String, String>,
    slow: bool,
) -> Result<(), WriteError> {
    // `safetensors::serialize`'s order: by type, larger alignment first, then by name.
    entries.sort_by(|a, b| b.dtype().cmp(&a.dtype()).then_with(|| a.name.cmp(&b.name)));
    let header = header(&entries, metadata)?;
    let placeholder_at = checksum_placeholder_at(&header)
        .ok_or_else(|| WriteError::Serialise("no checksum placeholder in the header".into()))?;
    let mut file = AtomicFile::create(path, &CHECKPOINT_FILE)?;
    let pause = std::time::Duration::from_millis(2000 / entries.len().max(1) as u64);
    let mut hasher = Sha256::new();
    let written = (|| {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file.file());
        out.write_all(&header)?;
        let mut scratch = Vec::new();
        for e in &entries {
            e.emit(&mut scratch, &mut |bytes| {
                hasher.update(bytes);
                out.write_all(bytes)
            })?;
            if slow {
                out.flush()?;
                std::thread::sleep(pause);
            }
        }
        out.flush()
    })();
    written.map_err(|e| file.error("write", e))?;
    let digest = crate::data::mnist::hex(&hasher.finalize());
    let f = file.file();
    let patched = f
        .seek(SeekFrom::Start(placeholder_at as u64))
        .and_then(|_| f.write_all(digest.as_bytes()));
    patched.map_err(|e| file.error("write", e))?;
    Ok(file.commit()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> HashMap<String, String> {
        (0..24)
            .map(|i| (format!("key{i}"), format!("value {i}")))
            .collect()
    }

    #[test]
    fn the_header_is_the_same_bytes_whatever_the_map_s_order() {
        let values = [1.0f32, 2.0, 3.0];
        let shape = [3];
        let entries = || {
            vec![
                Entry {
                    name: "b.weight".into(),
                    shape: &shape,
                    values: Values::Torch(&values),
                },
                Entry {
                    name: "a.num_batches_tracked".into(),
                    shape: &[],
                    values: Values::Counter(7),
                },
            ]
        };
        // Each map has its own random order (24 keys: two alike by chance is out of reach).
        let first = header(&entries(), metadata()).unwrap();
        let second = header(&entries(), metadata()).unwrap();
        assert_eq!(first, second);
        // Still what the crate reads: the metadata and both tensors, placeholder included.
        let n = u64::from_le_bytes(first[..8].try_into().unwrap()) as usize;
        let (len, parsed) =
            safetensors::SafeTensors::read_metadata(&[&first[..], &vec![0u8; 20][..]].concat())
                .unwrap();
        assert_eq!(len, n);
        let meta = parsed.metadata().as_ref().unwrap();
        assert_eq!(meta.len(), 25);
        assert_eq!(meta["key3"], "value 3");
        assert_eq!(meta[CHECKSUM_KEY], CHECKSUM_PLACEHOLDER);
        assert_eq!(parsed.tensors().len(), 2);
        assert!(checksum_placeholder_at(&first).is_some());
        // With no tensors the header is still one JSON object.
        let empty = header(&[], metadata()).unwrap();
        let n = u64::from_le_bytes(empty[..8].try_into().unwrap()) as usize;
        let json: serde_json::Value = serde_json::from_slice(&empty[8..8 + n]).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 1);
    }
}
