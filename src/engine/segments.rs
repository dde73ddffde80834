//! Exact KV accounting without asking llama.cpp. A run is a contiguous stretch of cells written
//! by one decode lineage; a branch holds a list of references to runs covering its positions in
//! order, each reference using a prefix of its run. A fork references its parent's runs (the
//! cells are shared, not copied); `fork_at(p)` references only the prefix below `p`. Since every
//! holder of a run uses a prefix of it, the cells of a run still alive are the longest prefix any
//! holder uses, and `total` — the sum of those — is the exact number of cells held, whatever order
//! forks and prunes happen in.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRef {
    pub id: u32,
    /// Cells of the run this holder uses (a prefix of it).
    pub used: u32,
}

#[derive(Default)]
struct Run {
    /// Prefix lengths used by the run's holders, one entry per holder.
    holders: Vec<u32>,
}

impl Run {
    fn alive(&self) -> u32 {
        self.holders.iter().copied().max().unwrap_or(0)
    }
}

#[derive(Default)]
pub struct Segments {
    runs: Vec<Run>,
    free: Vec<u32>,
    total: u64,
}

impl Segments {
    /// Cells held by all holders together.
    pub fn total(&self) -> u64 {
        self.total
    }

    fn create(&mut self, len: u32) -> RunRef {
        self.total += len as u64;
        let run = Run { holders: vec![len] };
        let id = match self.free.pop() {
            Some(id) => {
                self.runs[id as usize] = run;
                id
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        RunRef { id, used: len }
    }

    /// Adds a holder of `r.used` cells of run `r.id`.
    fn retain(&mut self, r: RunRef) {
        let run = &mut self.runs[r.id as usize];
        let before = run.alive();
        run.holders.push(r.used);
        self.total += (run.alive() - before) as u64;
    }

    /// Drops one holder of `r.used` cells of run `r.id`; a run nobody holds is recycled.
    fn release(&mut self, r: RunRef) {
        let run = &mut self.runs[r.id as usize];
        let before = run.alive();
        if let Some(i) = run.holders.iter().position(|&u| u == r.used) {
            run.holders.swap_remove(i);
        }
        self.total -= (before - run.alive()) as u64;
        if run.holders.is_empty() {
            self.free.push(r.id);
        }
    }

    /// References to the first `cells` cells covered by `runs` (for a new holder of them).
    pub fn share_prefix(&mut self, runs: &[RunRef], cells: u32) -> Vec<RunRef> {
        let mut out = Vec::new();
        let mut left = cells;
        for &r in runs {
            if left == 0 {
                break;
            }
            let used = r.used.min(left);
            let shared = RunRef { id: r.id, used };
            self.retain(shared);
            out.push(shared);
            left -= used;
        }
        out
    }

    /// References to all of `runs` (a fork at the holder's end).
    pub fn share(&mut self, runs: &[RunRef]) -> Vec<RunRef> {
        let cells = runs.iter().map(|r| r.used).sum();
        self.share_prefix(runs, cells)
    }

    /// Drops every reference in `runs`.
    pub fn release_all(&mut self, runs: &[RunRef]) {
        for &r in runs {
            self.release(r);
        }
    }

    /// Adds `n` cells written by one holder after its last ones: grows its own tail run in
    /// place when nobody else holds it, otherwise starts a new run.
    pub fn append(&mut self, runs: &mut Vec<RunRef>, n: u32) {
        if n == 0 {
            return;
        }
        if let Some(last) = runs.last_mut() {
            let run = &mut self.runs[last.id as usize];
            if run.holders.len() == 1 && run.holders[0] == last.used {
                run.holders[0] += n;
                last.used += n;
                self.total += n as u64;
                return;
            }
        }
        runs.push(self.create(n));
    }

    /// The cells held if the holders in `without` (each one holder's runs, as `share` and
    /// `append` gave them) let go: what evicting those holders would leave. Nothing changes.
    pub fn total_without(&self, without: &[&[RunRef]]) -> u64 {
        let mut dropped: HashMap<u32, Vec<u32>> = HashMap::new();
        for runs in without {
            for r in runs.iter() {
                dropped.entry(r.id).or_default().push(r.used);
            }
        }
        let mut total = self.total;
        for (id, used) in dropped {
            let run = &self.runs[id as usize];
            let mut left = run.holders.clone();
            for u in used {
                if let Some(i) = left.iter().position(|&h| h == u) {
                    left.swap_remove(i);
                }
            }
            total -= (run.alive() - left.iter().copied().max().unwrap_or(0)) as u64;
        }
        total
    }

    pub fn clear(&mut self) {
        *self = Segments::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_cells_count_once_whatever_the_prune_order() {
        let mut s = Segments::default();
        let mut parent = Vec::new();
        s.append(&mut parent, 10);
        assert_eq!(s.total(), 10);
        let mut child = s.share(&parent);
        assert_eq!(s.total(), 10, "a fork shares, it does not copy");
        s.append(&mut parent, 3);
        s.append(&mut child, 2);
        assert_eq!(s.total(), 15);
        s.append(&mut child, 1);
        assert_eq!(s.total(), 16, "the child's own tail grows in place");
        assert_eq!(child.len(), 2);
        s.release_all(&parent);
        assert_eq!(s.total(), 13, "the shared prefix stays with the child");
        s.release_all(&child);
        assert_eq!(s.total(), 0);
    }

    #[test]
    fn a_prefix_fork_holds_only_the_cells_below_its_position() {
        let mut s = Segments::default();
        let mut parent = Vec::new();
        s.append(&mut parent, 8);
        let mut tail_holder = s.share(&parent);
        s.append(&mut parent, 4); // parent: [8 shared][4 own]
        s.append(&mut tail_holder, 1);
        assert_eq!(s.total(), 13);
        let mut at5 = s.share_prefix(&parent, 5);
        assert_eq!(
            at5,
            vec![RunRef {
                id: parent[0].id,
                used: 5
            }]
        );
        assert_eq!(s.total(), 13, "cells below 5 are shared");
        s.append(&mut at5, 2);
        assert_eq!(at5.len(), 2, "a partial holder never grows the shared run");
        assert_eq!(s.total(), 15);
        let at10 = s.share_prefix(&parent, 10);
        assert_eq!(at10.iter().map(|r| r.used).collect::<Vec<_>>(), vec![8, 2]);
        s.release_all(&parent);
        s.release_all(&tail_holder);
        // Left: at5 (5 of run 0 + 2 own) and at10 (8 of run 0 + 2 of the parent's tail run).
        assert_eq!(s.total(), 8 + 2 + 2);
        s.release_all(&at10);
        assert_eq!(s.total(), 5 + 2);
        s.release_all(&at5);
        assert_eq!(s.total(), 0);
    }

    #[test]
    fn run_ids_are_recycled() {
        let mut s = Segments::default();
        let mut a = Vec::new();
        s.append(&mut a, 4);
        s.release_all(&a);
        let mut b = Vec::new();
        s.append(&mut b, 7);
        assert_eq!(a[0].id, b[0].id);
        assert_eq!(s.total(), 7);
    }

    #[test]
    fn total_without_counts_what_the_rest_hold() {
        let mut s = Segments::default();
        let mut root = Vec::new();
        s.append(&mut root, 10); // a cached prefix
        let mut cached_child = s.share(&root);
        s.append(&mut cached_child, 5); // a longer cached prefix forked from it
        let mut request = s.share_prefix(&root, 6);
        s.append(&mut request, 3); // a running request forked at 6
        assert_eq!(s.total(), 18);
        assert_eq!(s.total_without(&[]), 18);
        assert_eq!(
            s.total_without(&[&root, &cached_child]),
            9,
            "the request keeps 6 shared + 3"
        );
        assert_eq!(
            s.total_without(&[&cached_child]),
            13,
            "the root stays whole"
        );
        assert_eq!(s.total_without(&[&root, &cached_child, &request]), 0);
        assert_eq!(s.total(), 18, "nothing changed");
    }
}
