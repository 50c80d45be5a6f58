//! Links added and removed at run time (`dissem link add|remove`, `Federation.AddLink` and
//! `RemoveLink`): checked like `--link` flags (the flags go through the same
//! [`link_from_request`]), kept in the store so they survive restarts, started and stopped
//! without a restart. A link from the flags or the config file is changed there.

use super::*;

/// The longest a peer keeps a copy, or tries a spilled delivery: 7 days (a link's ttl is
/// refused above it, and a receiver caps what a sender asks at it).
pub const MAX_LINK_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A link's settings from their request form (the flags', the API's, the store's), checked;
/// errors name the request's field.
pub fn link_from_request(r: &v1::AddLinkRequest) -> Result<LinkConfig, ServiceError> {
    if !valid_name(&r.name) {
        return Err(ServiceError::invalid(
            "name",
            format!("{:?}: 1 to 64 letters, digits, `_ . -`", r.name),
        ));
    }
    if !(r.peer.starts_with("http://") || r.peer.starts_with("https://")) || r.peer.len() > 2048 {
        return Err(ServiceError::invalid(
            "peer",
            format!("{:?} is not an http:// or https:// URL", r.peer),
        ));
    }
    let ttl = Duration::from_millis(r.ttl_ms);
    if ttl > MAX_LINK_TTL {
        return Err(ServiceError::invalid(
            "ttl_ms",
            format!("{} ms is over 7 days (a peer keeps no longer)", r.ttl_ms),
        ));
    }
    let set = (r.ttl_ms > 0).then_some(ttl);
    let mode = match r.mode.as_str() {
        "" | "all-active" if set.is_none() => LinkMode::AllActive,
        "" | "all-active" => {
            return Err(ServiceError::invalid(
                "ttl_ms",
                "a ttl is for an active-passive or spillover link",
            ));
        }
        "active-passive" => LinkMode::ActivePassive {
            ttl: set.unwrap_or(DEFAULT_STANDBY_TTL),
        },
        "spillover" => LinkMode::Spillover { ttl: set },
        m => {
            return Err(ServiceError::invalid(
                "mode",
                format!("{m:?} is not all-active, active-passive or spillover"),
            ));
        }
    };
    if r.token.len() > 4096
        || tonic::metadata::MetadataValue::try_from(format!("Bearer {}", r.token)).is_err()
    {
        return Err(ServiceError::invalid(
            "token",
            "not header text of at most 4 KiB",
        ));
    }
    let filter = if r.filter.trim().is_empty() {
        None
    } else {
        use v1::subscription::Filter;
        let f = if r.filter.trim_start().starts_with('{') {
            Filter::Eventbridge(r.filter.clone())
        } else {
            Filter::Text(r.filter.clone())
        };
        let s = v1::Subscription {
            filter: Some(f),
            ..Default::default()
        };
        let dnf = runtime::validate::filter(&s, &runtime::Limits::default())
            .map_err(|e| ServiceError::invalid("filter", e.to_string()))?;
        Some(dnf)
    };
    Ok(LinkConfig {
        name: r.name.clone(),
        url: r.peer.clone(),
        token: (!r.token.is_empty()).then(|| r.token.clone()),
        filter,
        mode,
    })
}

/// A link kept in the store by an earlier `AddLink`.
pub(super) fn kept_link(bytes: &[u8]) -> Result<LinkConfig, ServiceError> {
    let r = v1::AddLinkRequest::decode(bytes)
        .map_err(|e| ServiceError::invalid("link", format!("does not decode: {e}")))?;
    link_from_request(&r)
}

impl Federation {
    /// Adds a link, kept in the store (durable before the answer), and starts its sender:
    /// it owes its peer what this node takes from now on.
    pub async fn add_link(&self, r: v1::AddLinkRequest) -> Result<v1::LinkInfo, ServiceError> {
        let cfg = link_from_request(&r)?;
        let link = Link::new(cfg, true);
        {
            let mut links = self.inner.links.write().unwrap_or_else(|p| p.into_inner());
            if links.iter().any(|l| l.cfg.name == r.name) {
                return Err(ServiceError::FailedPrecondition(format!(
                    "a link named {:?} exists (remove it first)",
                    r.name
                )));
            }
            links.push(link.clone());
        }
        let kept = self.inner.store.keep_link(&r.name, &r.encode_to_vec());
        if let Err(e) = kept {
            self.unlist(&r.name);
            return Err(e.into());
        }
        self.inner.store.commit().await?;
        tokio::spawn(self.clone().sender(link.clone()));
        tracing::info!(
            "link {} to {} added ({})",
            r.name,
            r.peer,
            link.cfg.mode.name()
        );
        Ok(self.info(&link))
    }

    /// Removes a link added with [`Federation::add_link`]: its sender stops and what it
    /// still owed is dropped (durable before the answer); returns how many entries that was.
    pub async fn remove_link(&self, name: &str) -> Result<u64, ServiceError> {
        let Some(link) = self.current().into_iter().find(|l| l.cfg.name == name) else {
            return Err(ServiceError::NotFound(format!("link {name:?}")));
        };
        if !link.added {
            return Err(ServiceError::FailedPrecondition(format!(
                "link {name:?} comes from --link or the config file: remove it there and \
                 restart"
            )));
        }
        link.removed.store(true, Ordering::SeqCst);
        self.unlist(name);
        let dropped = self.inner.store.forget_link(name)?;
        self.inner.store.commit().await?;
        self.wake();
        tracing::info!("link {name} removed; {dropped} entries it owed were dropped");
        Ok(dropped)
    }

    fn unlist(&self, name: &str) {
        self.inner
            .links
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.cfg.name != name);
    }
}
