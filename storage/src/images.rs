//! The images keyspace: block data images by name and version.

use super::*;

pub(super) fn image_key(name: &str, version: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 9);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

impl Store {
    /// Stores a data image version durably.
    pub async fn put_image(
        &self,
        name: &str,
        version: u64,
        bytes: &[u8],
    ) -> Result<(), StorageError> {
        self.images.insert(image_key(name, version), bytes)?;
        self.commit().await
    }

    /// One version of an image.
    pub fn get_image(&self, name: &str, version: u64) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .images
            .get(image_key(name, version))?
            .map(|v| v.to_vec()))
    }

    /// The newest version of an image.
    pub fn latest_image(&self, name: &str) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let mut prefix = name.as_bytes().to_vec();
        prefix.push(0);
        match self.images.scan_prefix(&prefix).next_back() {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv?;
                let version = k
                    .get(prefix.len()..)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or(StorageError::Corrupt {
                        tree: "images",
                        source: CodecError::Truncated,
                    })?;
                Ok(Some((version, v.to_vec())))
            }
        }
    }

    /// Drops versions of an image older than `keep_from`; returns how many.
    pub fn prune_images(&self, name: &str, keep_from: u64) -> Result<usize, StorageError> {
        let mut n = 0;
        for kv in self
            .images
            .range(image_key(name, 0)..image_key(name, keep_from))
        {
            let (k, _) = kv?;
            self.images.remove(k)?;
            n += 1;
        }
        Ok(n)
    }

    // --- delivery state -------------------------------------------------------------------------
}
