//! Per-branch work around a decode (logits copies, log-sum-exp, batched sampling) spread over
//! a pool of threads created once per context. llama.cpp's own threads are idle between
//! decodes, so on a machine with `n_threads` cores this work would otherwise leave all but one
//! of them unused; starting threads per call would cost more than the work at small N.

use rayon::prelude::*;

pub struct Pool {
    /// `None`: one thread (or no pool could be started), so work runs inline.
    threads: Option<rayon::ThreadPool>,
    width: usize,
}

impl Pool {
    pub fn new(width: usize) -> Pool {
        let threads = (width > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(width)
                    .thread_name(|i| format!("llama-branch-pool-{i}"))
                    .build()
                    .ok()
            })
            .flatten();
        Pool {
            width: if threads.is_some() { width } else { 1 },
            threads,
        }
    }

    /// Runs `f` on every item, the items split into at most `width` contiguous parts of at
    /// least `min_per_thread` items (fewer items run inline on the calling thread).
    pub fn for_each<T: Send>(
        &self,
        items: &mut [T],
        min_per_thread: usize,
        f: impl Fn(&mut T) + Sync + Send,
    ) {
        let parts = self.width.min(items.len() / min_per_thread.max(1)).max(1);
        match &self.threads {
            Some(pool) if parts > 1 => {
                let per_part = items.len().div_ceil(parts);
                pool.install(|| {
                    items
                        .par_chunks_mut(per_part)
                        .for_each(|part| part.iter_mut().for_each(&f))
                });
            }
            _ => items.iter_mut().for_each(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_visited_once() {
        for width in [1, 2, 3, 8] {
            let pool = Pool::new(width);
            for n in [0usize, 1, 2, 5, 33] {
                let mut items: Vec<u32> = vec![0; n];
                pool.for_each(&mut items, 1, |x| *x += 1);
                assert!(items.iter().all(|&x| x == 1), "width {width}, n {n}");
            }
        }
    }
}
