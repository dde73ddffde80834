//! Per-branch work after a decode (logits copies, log-sum-exp) and batched sampling, split over
//! the context's threads. llama.cpp's own threads are idle between decodes, so on a machine with
//! `n_threads` cores this work would otherwise leave all but one of them unused.

/// Runs `f` on every item, the items split into at most `threads` contiguous parts; the calling
/// thread takes the first part. Runs inline when there is too little work to pay for a thread
/// (`min_per_thread` items per part).
pub fn for_each<T: Send>(
    items: &mut [T],
    threads: usize,
    min_per_thread: usize,
    f: impl Fn(&mut T) + Sync,
) {
    let parts = threads.min(items.len() / min_per_thread.max(1)).max(1);
    if parts == 1 {
        items.iter_mut().for_each(f);
        return;
    }
    let per_part = items.len().div_ceil(parts);
    let f = &f;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks_mut(per_part);
        let first = chunks.next();
        for chunk in chunks {
            scope.spawn(move || chunk.iter_mut().for_each(f));
        }
        if let Some(chunk) = first {
            chunk.iter_mut().for_each(f);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_visited_once() {
        for threads in [1, 2, 3, 8] {
            for n in [0usize, 1, 2, 5, 33] {
                let mut items: Vec<u32> = vec![0; n];
                for_each(&mut items, threads, 1, |x| *x += 1);
                assert!(items.iter().all(|&x| x == 1), "threads {threads}, n {n}");
            }
        }
    }
}
