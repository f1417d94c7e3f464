//! Names a client chooses (tools, models, groups), bounded before they
//! become label values: the first `limit` distinct names keep their own
//! series, later ones are counted together as `_other`, so a client that
//! invents names cannot grow the registry without end.

use std::collections::HashSet;
use std::sync::Mutex;

/// The label value for names past the limit.
pub const OTHER: &str = "_other";

pub struct Bounded {
    limit: usize,
    seen: Mutex<HashSet<String>>,
}

impl Bounded {
    pub fn new(limit: usize) -> Bounded {
        Bounded {
            limit,
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// `name` if it has (or may get) its own series, else `_other`.
    pub fn label(&self, name: &str) -> String {
        let mut seen = self.seen.lock().expect("poisoned");
        if seen.contains(name) {
            return name.to_string();
        }
        if seen.len() < self.limit {
            seen.insert(name.to_string());
            return name.to_string();
        }
        OTHER.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_limit_share_one_label() {
        let names = Bounded::new(2);
        assert_eq!(names.label("a"), "a");
        assert_eq!(names.label("b"), "b");
        assert_eq!(names.label("c"), OTHER);
        assert_eq!(names.label("a"), "a");
    }
}
