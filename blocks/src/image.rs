//! Data images: the versioned, checksummed binary form of a shard's subscriptions and of the
//! incremental changes between versions, as stored in the storage layer and loaded by workers.
//!
//! Layout (little endian): `"DSIM"`, format `u16`, kind `u8` (1 full shard, 2 delta), version
//! `u64`, base version `u64` (deltas: the version they apply to), payload length `u32`, the
//! payload, then the xxh3-64 of everything before it. A full image carries the Bloom setting
//! and every subscription; a delta carries upserted subscriptions and removed ids, so one change
//! is one small image. Decoding checks every length, index, tag and number and returns an
//! [`ImageError`] for truncated, corrupted or hostile input; it never panics.

use xxhash_rust::xxh3::xxh3_64;

use crate::bloom::BloomConfig;
use crate::formula::{Conjunction, Dnf, MAX_CONJUNCTIONS, MAX_PREDICATES_PER_CONJUNCTION};
use crate::num::Num;
use crate::predicate::{Bound, Predicate, Test};

const MAGIC: &[u8; 4] = b"DSIM";
/// The current image format.
pub const FORMAT: u16 = 1;
const KIND_SHARD: u8 = 1;
const KIND_DELTA: u8 = 2;
/// A full shard whose attribute names come first, in a table ([`encode_shard_table`]).
const KIND_SHARD_TABLE: u8 = 3;
const HEADER: usize = 4 + 2 + 1 + 8 + 8 + 4;

/// Why an image could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image truncated: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("not a data image (bad magic)")]
    BadMagic,
    #[error("unsupported image format {0} (this build reads {FORMAT})")]
    Format(u16),
    #[error("expected a {expected} image, found kind {found}")]
    Kind { expected: &'static str, found: u8 },
    #[error("checksum mismatch: the image is corrupted")]
    Checksum,
    #[error("corrupt image at offset {offset}: {what}")]
    Corrupt { offset: usize, what: String },
}

/// A full shard image: every subscription of one version.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardImage {
    pub version: u64,
    pub bloom: BloomConfig,
    pub subs: Vec<(u64, Dnf)>,
}

/// The change from `base_version` to `version`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeltaImage {
    pub version: u64,
    pub base_version: u64,
    pub upserts: Vec<(u64, Dnf)>,
    pub removes: Vec<u64>,
}

// --- writing ---------------------------------------------------------------------------------

struct Writer {
    buf: Vec<u8>,
    attrs: std::collections::HashMap<String, u64>,
    /// Table mode ([`SubEncoder`]): attribute names live in the image's table, in first-use
    /// order here, and predicates carry only their index.
    table: Option<Vec<String>>,
}

impl Writer {
    fn new(table: Option<Vec<String>>) -> Writer {
        Writer {
            buf: Vec::new(),
            attrs: Default::default(),
            table,
        }
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn varint128(&mut self, mut v: u128) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn num(&mut self, n: Num) {
        // raw = m * 10^e with m not divisible by 10: short for round numbers
        let mut m = n.to_raw();
        let mut e = 0u8;
        // integers first, in one i128 division; the rest in i64 arithmetic when it fits
        const SCALE: i128 = 1_000_000_000_000_000_000;
        if m != 0 && m % SCALE == 0 {
            m /= SCALE;
            e = 18;
        }
        if let Ok(mut small) = i64::try_from(m) {
            while small != 0 && small % 10 == 0 {
                small /= 10;
                e += 1;
            }
            m = small as i128;
        } else {
            while m != 0 && m % 10 == 0 {
                m /= 10;
                e += 1;
            }
        }
        self.buf.push(e);
        let zig = ((m << 1) ^ (m >> 127)) as u128;
        self.varint128(zig);
    }

    fn bound(&mut self, b: Bound) {
        match b {
            Bound::Unbounded => self.buf.push(0),
            Bound::Incl(n) => {
                self.buf.push(1);
                self.num(n);
            }
            Bound::Excl(n) => {
                self.buf.push(2);
                self.num(n);
            }
        }
    }

    fn pred(&mut self, p: &Predicate) {
        let next = self.attrs.len() as u64;
        // the name is copied only the first time it is seen
        let idx = match self.attrs.get(&p.attr) {
            Some(i) => *i,
            None => {
                self.attrs.insert(p.attr.clone(), next);
                if let Some(t) = &mut self.table {
                    t.push(p.attr.clone());
                }
                next
            }
        };
        if idx == next && self.table.is_none() {
            // first use: attribute index, then its name
            self.varint(idx);
            self.bytes(p.attr.as_bytes());
        } else {
            self.varint(idx);
        }
        let tag = match &p.test {
            Test::Exists => 0,
            Test::Interval { .. } => 1,
            Test::NumIn(_) => 2,
            Test::StrIn(_) => 3,
            Test::Prefix(_) => 4,
            Test::Suffix(_) => 5,
            Test::Contains(_) => 6,
            Test::EqIgnoreCase(_) => 7,
            Test::PrefixIgnoreCase(_) => 8,
            Test::SuffixIgnoreCase(_) => 9,
            Test::Wildcard(_) => 10,
            Test::Cidr(_) => 11,
        };
        self.buf.push(tag << 1 | p.negated as u8);
        match &p.test {
            Test::Exists => {}
            Test::Interval { lo, hi } => {
                self.bound(*lo);
                self.bound(*hi);
            }
            Test::NumIn(v) => {
                self.varint(v.len() as u64);
                for n in v {
                    self.num(*n);
                }
            }
            Test::StrIn(v) => {
                self.varint(v.len() as u64);
                for s in v {
                    self.bytes(s.as_bytes());
                }
            }
            other => {
                if let Some((_, s)) = other.word_constant() {
                    self.bytes(s.as_bytes())
                }
            }
        }
    }

    fn subs(&mut self, subs: &[(u64, Dnf)]) {
        self.varint(subs.len() as u64);
        for (id, dnf) in subs {
            self.sub(*id, dnf);
        }
    }

    fn sub(&mut self, id: u64, dnf: &Dnf) {
        self.varint(id);
        self.varint(dnf.0.len() as u64);
        for c in &dnf.0 {
            self.varint(c.0.len() as u64);
            for p in &c.0 {
                self.pred(p);
            }
        }
    }
}

fn frame(kind: u8, version: u64, base_version: u64, payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&base_version.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Encodes a full shard image.
pub fn encode_shard(img: &ShardImage) -> Vec<u8> {
    let mut w = Writer::new(None);
    w.varint(img.bloom.bits as u64);
    w.varint(img.bloom.k as u64);
    w.subs(&img.subs);
    frame(KIND_SHARD, img.version, 0, w.buf)
}

/// Encodes subscriptions one at a time against one growing attribute table, so a registry
/// can keep each subscription's bytes and write a full image by concatenation
/// ([`encode_shard_table`]) instead of encoding every filter again for every version.
#[derive(Debug)]
pub struct SubEncoder {
    w: Writer,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Writer({} attributes)", self.attrs.len())
    }
}

impl Default for SubEncoder {
    fn default() -> SubEncoder {
        SubEncoder {
            w: Writer::new(Some(Vec::new())),
        }
    }
}

impl SubEncoder {
    /// One subscription's bytes (valid with this encoder's table as it is now or later).
    pub fn encode(&mut self, id: u64, dnf: &Dnf) -> Vec<u8> {
        self.w.buf.clear();
        self.w.sub(id, dnf);
        std::mem::take(&mut self.w.buf)
    }

    /// The attribute table: every name encoded so far, by index.
    pub fn table(&self) -> &[String] {
        self.w.table.as_deref().unwrap_or(&[])
    }
}

/// A full shard image from subscription bytes of one [`SubEncoder`] (in id order) and its
/// table; decodes to the same [`ShardImage`] as [`encode_shard`] of the same subscriptions.
pub fn encode_shard_table<B: AsRef<[u8]>>(
    version: u64,
    bloom: BloomConfig,
    table: &[String],
    subs: &[B],
) -> Vec<u8> {
    let mut w = Writer::new(None);
    w.buf
        .reserve(subs.iter().map(|b| b.as_ref().len()).sum::<usize>() + 64);
    w.varint(bloom.bits as u64);
    w.varint(bloom.k as u64);
    w.varint(table.len() as u64);
    for name in table {
        w.bytes(name.as_bytes());
    }
    w.varint(subs.len() as u64);
    for b in subs {
        w.buf.extend_from_slice(b.as_ref());
    }
    frame(KIND_SHARD_TABLE, version, 0, w.buf)
}

/// Encodes a delta image.
pub fn encode_delta(img: &DeltaImage) -> Vec<u8> {
    let mut w = Writer::new(None);
    w.subs(&img.upserts);
    w.varint(img.removes.len() as u64);
    for id in &img.removes {
        w.varint(*id);
    }
    frame(KIND_DELTA, img.version, img.base_version, w.buf)
}

// --- reading ---------------------------------------------------------------------------------

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
    attrs: Vec<String>,
    /// The attributes came in a table: an index past it is corrupt, never a new name.
    fixed: bool,
}

impl<'a> Reader<'a> {
    fn new(payload: &'a [u8]) -> Reader<'a> {
        Reader {
            buf: payload,
            pos: 0,
            base: HEADER,
            attrs: Vec::new(),
            fixed: false,
        }
    }

    fn corrupt<T>(&self, what: impl Into<String>) -> Result<T, ImageError> {
        Err(ImageError::Corrupt {
            offset: self.base + self.pos,
            what: what.into(),
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        if self.buf.len() - self.pos < n {
            return Err(ImageError::Truncated {
                offset: self.base + self.pos,
                needed: n - (self.buf.len() - self.pos),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, ImageError> {
        Ok(self.take(1)?[0])
    }

    fn varint128(&mut self, max_bits: u32) -> Result<u128, ImageError> {
        let mut v: u128 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            let chunk = (b & 0x7f) as u128;
            if shift >= max_bits || (max_bits - shift < 7 && chunk >> (max_bits - shift) != 0) {
                return self.corrupt("varint too long");
            }
            v |= chunk << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
            shift += 7;
        }
    }

    fn varint(&mut self) -> Result<u64, ImageError> {
        let v = self.varint128(64)?;
        u64::try_from(v).or_else(|_| self.corrupt("varint out of range"))
    }

    /// A count of items that each take at least `min_bytes`: bounded by what remains.
    fn count(&mut self, min_bytes: usize, limit: u64, what: &str) -> Result<usize, ImageError> {
        let n = self.varint()?;
        if n > limit {
            return self.corrupt(format!("{what} count {n} exceeds the limit {limit}"));
        }
        if n.saturating_mul(min_bytes as u64) > (self.buf.len() - self.pos) as u64 {
            return Err(ImageError::Truncated {
                offset: self.base + self.pos,
                needed: (n as usize).saturating_mul(min_bytes) - (self.buf.len() - self.pos),
            });
        }
        Ok(n as usize)
    }

    fn bloom(&mut self) -> Result<BloomConfig, ImageError> {
        let bits = self.varint()?;
        let k = self.varint()?;
        let bloom = BloomConfig {
            bits: u32::try_from(bits).unwrap_or(0),
            k: u32::try_from(k).unwrap_or(0),
        };
        if bloom.validate().is_err() {
            return self.corrupt(format!("invalid bloom setting {bits} bits, k {k}"));
        }
        Ok(bloom)
    }

    fn string(&mut self) -> Result<String, ImageError> {
        let n = self.count(1, u32::MAX as u64, "string length")?;
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => self.corrupt("invalid UTF-8 in a string"),
        }
    }

    fn num(&mut self) -> Result<Num, ImageError> {
        let e = self.byte()?;
        let zig = self.varint128(128)?;
        let m = ((zig >> 1) as i128) ^ -((zig & 1) as i128);
        let mut raw = m;
        for _ in 0..e {
            raw = match raw.checked_mul(10) {
                Some(r) => r,
                None => return self.corrupt("number out of range"),
            };
        }
        // round-trip through text to enforce the documented range
        let n = Num::from_raw(raw);
        match Num::parse(&n.to_string()) {
            Ok(v) if v == n => Ok(n),
            _ => self.corrupt("number out of range"),
        }
    }

    fn bound(&mut self) -> Result<Bound, ImageError> {
        match self.byte()? {
            0 => Ok(Bound::Unbounded),
            1 => Ok(Bound::Incl(self.num()?)),
            2 => Ok(Bound::Excl(self.num()?)),
            t => self.corrupt(format!("unknown bound tag {t}")),
        }
    }

    fn pred(&mut self) -> Result<Predicate, ImageError> {
        let idx = self.varint()?;
        let attr = if idx as usize == self.attrs.len() && !self.fixed {
            let name = self.string()?;
            if name.is_empty() {
                return self.corrupt("empty attribute name");
            }
            self.attrs.push(name.clone());
            name
        } else if (idx as usize) < self.attrs.len() {
            self.attrs[idx as usize].clone()
        } else {
            return self.corrupt(format!("attribute index {idx} not defined yet"));
        };
        let tag = self.byte()?;
        let negated = tag & 1 == 1;
        let test = match tag >> 1 {
            0 => Test::Exists,
            1 => Test::Interval {
                lo: self.bound()?,
                hi: self.bound()?,
            },
            2 => {
                let n = self.count(2, u32::MAX as u64, "set")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.num()?);
                }
                if v.is_empty() {
                    return self.corrupt("empty number set");
                }
                Test::NumIn(v)
            }
            3 => {
                let n = self.count(1, u32::MAX as u64, "set")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string()?);
                }
                if v.is_empty() {
                    return self.corrupt("empty string set");
                }
                Test::StrIn(v)
            }
            4 => Test::Prefix(self.string()?),
            5 => Test::Suffix(self.string()?),
            6 => Test::Contains(self.string()?),
            7 => Test::EqIgnoreCase(self.string()?),
            8 => Test::PrefixIgnoreCase(self.string()?),
            9 => Test::SuffixIgnoreCase(self.string()?),
            10 => {
                let w = self.string()?;
                if let Err(e) = crate::pattern::check_wildcard(&w) {
                    return self.corrupt(format!("wildcard: {e}"));
                }
                Test::Wildcard(w)
            }
            11 => match crate::pattern::canonical_cidr(&self.string()?) {
                Ok(c) => Test::Cidr(c),
                Err(e) => return self.corrupt(format!("cidr: {e}")),
            },
            t => return self.corrupt(format!("unknown predicate tag {t}")),
        };
        Ok(Predicate::new(attr, test, negated))
    }

    fn subs(&mut self) -> Result<Vec<(u64, Dnf)>, ImageError> {
        let n = self.count(3, u64::MAX, "subscription")?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.varint()?;
            let nc = self.count(2, MAX_CONJUNCTIONS as u64, "conjunction")?;
            if nc == 0 {
                return self.corrupt("subscription without conjunctions");
            }
            let mut conjs = Vec::with_capacity(nc);
            for _ in 0..nc {
                let np = self.count(2, MAX_PREDICATES_PER_CONJUNCTION as u64, "predicate")?;
                if np == 0 {
                    return self.corrupt("empty conjunction");
                }
                let mut preds = Vec::with_capacity(np);
                for _ in 0..np {
                    preds.push(self.pred()?);
                }
                conjs.push(Conjunction::new(preds));
            }
            out.push((id, Dnf(conjs)));
        }
        Ok(out)
    }
}

struct Framed<'a> {
    kind: u8,
    version: u64,
    base_version: u64,
    payload: &'a [u8],
}

fn unframe(buf: &[u8]) -> Result<Framed<'_>, ImageError> {
    if buf.len() < HEADER + 8 {
        if buf.len() >= 4 && &buf[..4] != MAGIC {
            return Err(ImageError::BadMagic);
        }
        return Err(ImageError::Truncated {
            offset: buf.len(),
            needed: HEADER + 8 - buf.len(),
        });
    }
    if &buf[..4] != MAGIC {
        return Err(ImageError::BadMagic);
    }
    let le8 = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let format = u16::from_le_bytes([buf[4], buf[5]]);
    if format != FORMAT {
        return Err(ImageError::Format(format));
    }
    let kind = buf[6];
    let version = le8(7);
    let base_version = le8(15);
    let len = u32::from_le_bytes([buf[23], buf[24], buf[25], buf[26]]) as usize;
    let total = HEADER + len + 8;
    if buf.len() < total {
        return Err(ImageError::Truncated {
            offset: buf.len(),
            needed: total - buf.len(),
        });
    }
    if buf.len() > total {
        return Err(ImageError::Corrupt {
            offset: total,
            what: format!("{} trailing bytes", buf.len() - total),
        });
    }
    if xxh3_64(&buf[..HEADER + len]) != le8(HEADER + len) {
        return Err(ImageError::Checksum);
    }
    Ok(Framed {
        kind,
        version,
        base_version,
        payload: &buf[HEADER..HEADER + len],
    })
}

fn finish(r: &Reader<'_>) -> Result<(), ImageError> {
    if r.pos != r.buf.len() {
        return r.corrupt(format!("{} unread payload bytes", r.buf.len() - r.pos));
    }
    Ok(())
}

/// A full shard's payload; `table`: its attribute names come first (kind 3), and every
/// predicate names one of them by index.
fn decode_shard_payload(
    payload: &[u8],
    version: u64,
    table: bool,
) -> Result<ShardImage, ImageError> {
    let mut r = Reader::new(payload);
    let bloom = r.bloom()?;
    if table {
        let n = r.count(2, u32::MAX as u64, "attribute")?;
        for _ in 0..n {
            let name = r.string()?;
            if name.is_empty() {
                return r.corrupt("empty attribute name");
            }
            r.attrs.push(name);
        }
        r.fixed = true;
    }
    let subs = r.subs()?;
    finish(&r)?;
    Ok(ShardImage {
        version,
        bloom,
        subs,
    })
}

/// Decodes a full shard image.
pub fn decode_shard(buf: &[u8]) -> Result<ShardImage, ImageError> {
    let f = unframe(buf)?;
    match f.kind {
        KIND_SHARD => decode_shard_payload(f.payload, f.version, false),
        KIND_SHARD_TABLE => decode_shard_payload(f.payload, f.version, true),
        found => Err(ImageError::Kind {
            expected: "shard",
            found,
        }),
    }
}

/// Decodes a delta image.
pub fn decode_delta(buf: &[u8]) -> Result<DeltaImage, ImageError> {
    let f = unframe(buf)?;
    if f.kind != KIND_DELTA {
        return Err(ImageError::Kind {
            expected: "delta",
            found: f.kind,
        });
    }
    let mut r = Reader::new(f.payload);
    let upserts = r.subs()?;
    let n = r.count(1, u64::MAX, "removal")?;
    let mut removes = Vec::with_capacity(n);
    for _ in 0..n {
        removes.push(r.varint()?);
    }
    finish(&r)?;
    Ok(DeltaImage {
        version: f.version,
        base_version: f.base_version,
        upserts,
        removes,
    })
}

/// Decodes a shard payload without the frame (for robustness tests of the parser itself).
#[doc(hidden)]
pub fn decode_shard_payload_unchecked(payload: &[u8]) -> Result<ShardImage, ImageError> {
    decode_shard_payload(payload, 0, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_text;

    /// Subscription bytes kept per subscription and concatenated make the same shard as
    /// encoding them all at once; an index past the table is corruption, not a panic.
    #[test]
    fn a_table_image_from_kept_bytes_decodes_like_a_full_one() {
        let img = sample();
        let mut enc = SubEncoder::default();
        let bytes: Vec<Vec<u8>> = img.subs.iter().map(|(id, d)| enc.encode(*id, d)).collect();
        let table = enc.table().to_vec();
        // a later subscription may add names: earlier bytes stay valid
        let extra = parse_text("brand_new = 1").expect("valid");
        let extra_bytes = enc.encode(99_999, &extra);
        let mut all = bytes.clone();
        all.push(extra_bytes);
        let out = encode_shard_table(img.version, img.bloom, enc.table(), &all);
        let mut want = img.clone();
        want.subs.push((99_999, extra));
        assert_eq!(decode_shard(&out), Ok(want));
        let short = encode_shard_table(img.version, img.bloom, &table, &all);
        assert!(matches!(
            decode_shard(&short),
            Err(ImageError::Corrupt { .. })
        ));
        assert_eq!(
            decode_shard(&encode_shard_table(img.version, img.bloom, &table, &bytes)),
            Ok(img)
        );
    }

    fn sample() -> ShardImage {
        let filters = [
            r#"temp > 30 && site prefix "kr/seoul/" || type in ["cam","lidar"]"#,
            "x range [0.5, 1e3) && y != -7 && z not exists",
            r#"s suffix ".jpg" && s contains "cat" && n in [1, 2, 3] && q ieq "AbC""#,
            "big = 18446744073709551615 && tiny = 0.000000000000000001",
        ];
        ShardImage {
            version: 7,
            bloom: BloomConfig::default(),
            subs: filters
                .iter()
                .enumerate()
                .map(|(i, f)| (i as u64 * 1000, parse_text(f).expect("valid")))
                .collect(),
        }
    }

    #[test]
    fn round_trips() {
        let img = sample();
        let bytes = encode_shard(&img);
        assert_eq!(decode_shard(&bytes), Ok(img.clone()));
        let delta = DeltaImage {
            version: 8,
            base_version: 7,
            upserts: img.subs[..2].to_vec(),
            removes: vec![3000, 5],
        };
        assert_eq!(decode_delta(&encode_delta(&delta)), Ok(delta));
        assert!(matches!(decode_delta(&bytes), Err(ImageError::Kind { .. })));
    }

    #[test]
    fn truncation_and_corruption_are_errors() {
        let bytes = encode_shard(&sample());
        for cut in 0..bytes.len() {
            assert!(decode_shard(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                assert!(decode_shard(&b).is_err(), "flip at {i}");
            }
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_shard(&long).is_err());
        assert_eq!(
            decode_shard(b"nope-nope-nope-nope-nope-nope-nope-nope"),
            Err(ImageError::BadMagic)
        );
    }

    #[test]
    fn payload_parser_survives_garbage() {
        // past the checksum the parser still validates: random payloads never panic
        let mut seed = 1u64;
        for len in 0..2000usize {
            let mut buf = Vec::with_capacity(len % 200);
            for _ in 0..len % 200 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                buf.push((seed >> 56) as u8);
            }
            let _ = decode_shard_payload_unchecked(&buf);
        }
        // and every truncation of a valid payload is an error
        let bytes = encode_shard(&sample());
        let payload = &bytes[HEADER..bytes.len() - 8];
        for cut in 0..payload.len() {
            assert!(
                decode_shard_payload_unchecked(&payload[..cut]).is_err(),
                "cut {cut}"
            );
        }
    }
}
