//! Sequence-id leases. The store owns ids `0..n_seq_max`; each live branch holds exactly one.
//! Invariant: a vacant id has no KV cells tagged with it, so a new tenant always starts clean.
//! (Clearing the KV on release is the store's job; this type is pure bookkeeping.)

pub use crate::llama::SeqId;

#[derive(Debug, Clone)]
pub struct LeasePool {
    /// LIFO stack: the most recently released id is handed out next (its cells are warm).
    vacant: Vec<SeqId>,
    leased: Vec<bool>,
}

impl LeasePool {
    pub fn new(n_seq_max: u32) -> Self {
        LeasePool {
            vacant: (0..n_seq_max as SeqId).rev().collect(),
            leased: vec![false; n_seq_max as usize],
        }
    }

    pub fn capacity(&self) -> u32 {
        self.leased.len() as u32
    }

    pub fn available(&self) -> u32 {
        self.vacant.len() as u32
    }

    pub fn in_use(&self) -> u32 {
        self.capacity() - self.available()
    }

    pub fn is_leased(&self, seq: SeqId) -> bool {
        seq >= 0 && (seq as usize) < self.leased.len() && self.leased[seq as usize]
    }

    /// The vacant ids in the order `acquire` hands them out.
    pub fn vacant_in_order(&self) -> impl DoubleEndedIterator<Item = SeqId> + '_ {
        self.vacant.iter().rev().copied()
    }

    /// Takes the next vacant id (seq 0 first on a fresh pool).
    pub fn acquire(&mut self) -> Option<SeqId> {
        let seq = self.vacant.pop()?;
        self.leased[seq as usize] = true;
        Some(seq)
    }

    /// Takes a specific id if it is in range and vacant.
    pub fn acquire_exact(&mut self, seq: SeqId) -> Option<SeqId> {
        if seq < 0 || seq as usize >= self.leased.len() || self.leased[seq as usize] {
            return None;
        }
        let at = self.vacant.iter().position(|&s| s == seq)?;
        self.vacant.remove(at);
        self.leased[seq as usize] = true;
        Some(seq)
    }

    /// Returns an id to the pool. The caller must already have removed its KV cells.
    pub fn release(&mut self, seq: SeqId) {
        if self.is_leased(seq) {
            self.leased[seq as usize] = false;
            self.vacant.push(seq);
        }
    }

    /// Keeps only `keep` leased; every other id becomes vacant (in fresh order).
    pub fn retain_only(&mut self, keep: SeqId) {
        let n = self.leased.len() as SeqId;
        self.vacant = (0..n).rev().filter(|&s| s != keep).collect();
        for (seq, leased) in self.leased.iter_mut().enumerate() {
            *leased = seq as SeqId == keep;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_zero_first_then_ascending() {
        let mut p = LeasePool::new(4);
        assert_eq!(
            (0..4).map(|_| p.acquire().unwrap()).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(p.acquire(), None);
        assert_eq!(p.available(), 0);
        assert_eq!(p.in_use(), 4);
    }

    #[test]
    fn release_is_lifo_and_idempotent() {
        let mut p = LeasePool::new(4);
        for _ in 0..4 {
            p.acquire();
        }
        p.release(2);
        p.release(2);
        p.release(1);
        assert_eq!(p.available(), 2);
        assert_eq!(p.acquire(), Some(1));
        assert_eq!(p.acquire(), Some(2));
    }

    #[test]
    fn acquire_exact_checks_range_and_vacancy() {
        let mut p = LeasePool::new(3);
        assert_eq!(p.acquire_exact(2), Some(2));
        assert_eq!(p.acquire_exact(2), None);
        assert_eq!(p.acquire_exact(3), None);
        assert_eq!(p.acquire_exact(-1), None);
        assert_eq!(p.acquire(), Some(0));
        assert_eq!(p.acquire(), Some(1));
        assert_eq!(p.acquire(), None);
    }

    #[test]
    fn retain_only_keeps_one() {
        let mut p = LeasePool::new(4);
        for _ in 0..4 {
            p.acquire();
        }
        p.retain_only(2);
        assert_eq!(p.available(), 3);
        assert!(p.is_leased(2));
        assert!(!p.is_leased(0));
        let next: Vec<_> = (0..3).map(|_| p.acquire().unwrap()).collect();
        assert_eq!(next, vec![0, 1, 3]);
    }

    #[test]
    fn zero_capacity_pool_is_empty() {
        let mut p = LeasePool::new(0);
        assert_eq!(p.acquire(), None);
        assert_eq!(p.available(), 0);
    }
}
