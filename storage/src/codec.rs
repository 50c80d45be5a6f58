//! The binary form of stored objects. Decoding checks every length and tag and returns an
//! error for truncated or corrupt records, never panics.

use blocks::{Num, Value};

use crate::{DeliveryState, ObjectId, StoredObject};

const VERSION: u8 = 1;

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record truncated")]
    Truncated,
    #[error("unknown record version {0}")]
    Version(u8),
    #[error("unknown value tag {0}")]
    Tag(u8),
    #[error("invalid UTF-8")]
    Utf8,
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Encodes an object (its id is the record's key, not part of the value).
pub fn encode_object(o: &StoredObject) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + o.data.len());
    out.push(VERSION);
    out.push(o.priority);
    out.extend_from_slice(&o.received_unix_ms.to_le_bytes());
    put_bytes(&mut out, o.message_id.as_bytes());
    put_bytes(&mut out, o.external_id.as_bytes());
    put_bytes(&mut out, &o.data);
    out.extend_from_slice(&(o.metadata.len() as u32).to_le_bytes());
    for (k, v) in &o.metadata {
        put_bytes(&mut out, k.as_bytes());
        match v {
            Value::Num(n) => {
                out.push(0);
                out.extend_from_slice(&n.to_raw().to_le_bytes());
            }
            Value::Str(s) => {
                out.push(1);
                put_bytes(&mut out, s.as_bytes());
            }
        }
    }
    out
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.b.len() < n {
            return Err(CodecError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        self.take(N)?.try_into().map_err(|_| CodecError::Truncated)
    }

    fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = u32::from_le_bytes(self.arr()?) as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, CodecError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_string)
            .map_err(|_| CodecError::Utf8)
    }
}

/// Decodes an object record stored under `id`.
pub fn decode_object(b: &[u8], id: ObjectId) -> Result<StoredObject, CodecError> {
    let mut r = Reader { b };
    let [version] = r.arr()?;
    if version != VERSION {
        return Err(CodecError::Version(version));
    }
    let [priority] = r.arr()?;
    let received_unix_ms = u64::from_le_bytes(r.arr()?);
    let message_id = r.string()?;
    let external_id = r.string()?;
    let data = r.bytes()?.to_vec();
    let n = u32::from_le_bytes(r.arr()?) as usize;
    let mut metadata = Vec::with_capacity(n.min(r.b.len() / 5));
    for _ in 0..n {
        let k = r.string()?;
        let [tag] = r.arr()?;
        let v = match tag {
            0 => Value::Num(Num::from_raw(i128::from_le_bytes(r.arr()?))),
            1 => Value::Str(r.string()?),
            t => return Err(CodecError::Tag(t)),
        };
        metadata.push((k, v));
    }
    if !r.b.is_empty() {
        return Err(CodecError::Truncated);
    }
    Ok(StoredObject {
        id,
        data,
        external_id,
        metadata,
        priority,
        message_id,
        received_unix_ms,
    })
}

/// Encodes a delivery record.
pub fn encode_delivery(d: &DeliveryState) -> Vec<u8> {
    let mut out = vec![VERSION];
    match d {
        DeliveryState::Pending {
            attempts,
            next_attempt_unix_ms,
        } => {
            out.push(0);
            out.extend_from_slice(&attempts.to_le_bytes());
            out.extend_from_slice(&next_attempt_unix_ms.to_le_bytes());
        }
        DeliveryState::Received {
            attempts,
            next_attempt_unix_ms,
        } => {
            out.push(3);
            out.extend_from_slice(&attempts.to_le_bytes());
            out.extend_from_slice(&next_attempt_unix_ms.to_le_bytes());
        }
        DeliveryState::Acked { at_unix_ms } => {
            out.push(1);
            out.extend_from_slice(&at_unix_ms.to_le_bytes());
        }
        DeliveryState::DeadLetter { reason, at_unix_ms } => {
            out.push(2);
            out.extend_from_slice(&at_unix_ms.to_le_bytes());
            put_bytes(&mut out, reason.as_bytes());
        }
    }
    out
}

/// Decodes a delivery record.
pub fn decode_delivery(b: &[u8]) -> Result<DeliveryState, CodecError> {
    let mut r = Reader { b };
    let [version] = r.arr()?;
    if version != VERSION {
        return Err(CodecError::Version(version));
    }
    let [tag] = r.arr()?;
    let d = match tag {
        0 => DeliveryState::Pending {
            attempts: u32::from_le_bytes(r.arr()?),
            next_attempt_unix_ms: u64::from_le_bytes(r.arr()?),
        },
        1 => DeliveryState::Acked {
            at_unix_ms: u64::from_le_bytes(r.arr()?),
        },
        2 => DeliveryState::DeadLetter {
            at_unix_ms: u64::from_le_bytes(r.arr()?),
            reason: r.string()?,
        },
        3 => DeliveryState::Received {
            attempts: u32::from_le_bytes(r.arr()?),
            next_attempt_unix_ms: u64::from_le_bytes(r.arr()?),
        },
        t => return Err(CodecError::Tag(t)),
    };
    if !r.b.is_empty() {
        return Err(CodecError::Truncated);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let id = ObjectId { node: 1, seq: 2 };
        let o = StoredObject {
            id,
            data: b"hello".to_vec(),
            external_id: "s3://b/k".into(),
            metadata: vec![
                ("t".into(), Value::Num(Num::parse("-0.5").expect("num"))),
                ("s".into(), Value::from("日本")),
            ],
            priority: 7,
            message_id: "m".into(),
            received_unix_ms: 42,
        };
        let b = encode_object(&o);
        assert_eq!(decode_object(&b, id), Ok(o));
        for cut in 0..b.len() {
            assert!(decode_object(&b[..cut], id).is_err());
        }
    }
}
