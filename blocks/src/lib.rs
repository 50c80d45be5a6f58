//! The matching core of dissem: predicates, subscription syntaxes, Bloom encoding, test blocks,
//! match blocks and their data images.
//!
//! Pure computation: no I/O, no async, no clocks. Everything here is deterministic so that the
//! coordinator, workers and GPU kernel can rely on identical answers from identical inputs.

pub mod bloom;
pub mod cells;
pub mod eventbridge;
pub mod formula;
pub mod hash;
pub mod image;
pub mod index;
pub mod interval;
pub mod num;
pub mod numeric;
pub mod pattern;
pub mod predicate;
pub mod quote;
pub mod reference;
pub mod shard;
pub mod strings;
pub mod text;

pub use formula::{Conjunction, Dnf, Formula};
pub use index::MatchIndex;
pub use num::Num;
pub use predicate::{Bound, Event, Predicate, Test, Value};
pub use reference::ReferenceMatcher;
pub use shard::{ShardConfig, Strategy, StrategyChoice};
