//! A list that keeps its first `N` items and drops the others (the report's lists; their totals are counters of their own).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The first `N` items pushed. On the wire, a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded<T, const N: usize> {
    items: Vec<T>,
}

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded { items: Vec::new() }
    }
}

impl<T, const N: usize> Bounded<T, N> {
    /// Keeps `item` while fewer than `N` are kept; returns whether it was kept.
    pub fn push(&mut self, item: T) -> bool {
        self.push_with(|| item)
    }

    /// As [`Bounded::push`], building the item only when it is kept.
    pub fn push_with(&mut self, item: impl FnOnce() -> T) -> bool {
        let keep = !self.is_full();
        if keep {
            self.items.push(item());
        }
        keep
    }

    /// Whether the next item would only be counted.
    pub fn is_full(&self) -> bool {
        self.items.len() >= N
    }

    /// Adds `other`'s items, as many as fit.
    pub fn append(&mut self, other: Bounded<T, N>) {
        for item in other.items {
            self.push(item);
        }
    }

    /// The kept items.
    pub fn into_vec(self) -> Vec<T> {
        self.items
    }
}

impl<T, const N: usize> std::ops::Deref for Bounded<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<T, const N: usize> FromIterator<T> for Bounded<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let mut b = Bounded::default();
        items.into_iter().for_each(|i| {
            b.push(i);
        });
        b
    }
}

impl<T: Serialize, const N: usize> Serialize for Bounded<T, N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.items.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Vec::<T>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_n_and_builds_no_other() {
        let mut b: Bounded<u32, 2> = Bounded::default();
        assert!(b.push(1) && b.push(2) && !b.push(3));
        let mut built = false;
        assert!(!b.push_with(|| {
            built = true;
            4
        }));
        assert!(!built, "an item left out is not built");
        assert_eq!((&b[..], b.is_full()), (&[1, 2][..], true));
        let mut a: Bounded<u32, 2> = [9].into_iter().collect();
        a.append(b);
        assert_eq!(&a[..], &[9, 1][..]);
        assert_eq!(serde_json::to_string(&a).unwrap(), "[9,1]");
        let back: Bounded<u32, 2> = serde_json::from_str("[1,2,3]").unwrap();
        assert_eq!((back.into_vec(), 2), (vec![1, 2], 2));
    }
}
