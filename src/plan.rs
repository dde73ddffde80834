//! Decode planning: how variable-length token runs are packed into `llama_decode` calls.
//! Pure (only lengths are read), so it is unit-tested without a model.

/// One `llama_decode` worth of work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Several whole runs packed into one batch of at most `n_batch` tokens.
    Packed(Vec<usize>),
    /// One run longer than `n_batch`: decoded alone over consecutive sub-batches.
    Oversized(usize),
}

/// Order-preserving next-fit packing. Empty runs are skipped; a run that does not fit the open
/// chunk starts a new one (no back-filling, so decode order equals input order).
pub fn bin_pack(lengths: &[usize], n_batch: usize) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut open_total = 0usize;
    let mut open = false;
    for (i, &len) in lengths.iter().enumerate() {
        if len == 0 {
            continue;
        }
        if len > n_batch {
            chunks.push(Chunk::Oversized(i));
            open = false;
            continue;
        }
        match chunks.last_mut() {
            Some(Chunk::Packed(items)) if open && open_total + len <= n_batch => {
                items.push(i);
                open_total += len;
            }
            _ => {
                chunks.push(Chunk::Packed(vec![i]));
                open_total = len;
                open = true;
            }
        }
    }
    chunks
}

/// Splits `len` tokens into consecutive `(start, count)` pieces of at most `n_batch`.
pub fn sub_batches(len: usize, n_batch: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(n_batch.max(1))
        .map(move |start| (start, n_batch.min(len - start)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Chunk::*;

    #[test]
    fn packs_in_order_without_backfilling() {
        assert_eq!(
            bin_pack(&[6, 6, 4], 10),
            vec![Packed(vec![0]), Packed(vec![1, 2])]
        );
        assert_eq!(
            bin_pack(&[6, 11, 4], 10),
            vec![Packed(vec![0]), Oversized(1), Packed(vec![2])]
        );
        assert_eq!(bin_pack(&[0, 3, 0, 3], 10), vec![Packed(vec![1, 3])]);
        assert_eq!(
            bin_pack(&[10, 1], 10),
            vec![Packed(vec![0]), Packed(vec![1])]
        );
        assert_eq!(
            bin_pack(&[5, 5, 5], 10),
            vec![Packed(vec![0, 1]), Packed(vec![2])]
        );
    }

    #[test]
    fn empty_inputs_yield_no_chunks() {
        assert!(bin_pack(&[], 8).is_empty());
        assert!(bin_pack(&[0, 0], 8).is_empty());
    }

    #[test]
    fn every_packed_chunk_respects_the_limit_and_every_run_appears_once() {
        let lengths: Vec<usize> = (0..200).map(|i| (i * 37 + 11) % 70).collect();
        let chunks = bin_pack(&lengths, 64);
        let mut seen = vec![0; lengths.len()];
        for chunk in &chunks {
            match chunk {
                Packed(items) => {
                    assert!(items.iter().map(|&i| lengths[i]).sum::<usize>() <= 64);
                    for &i in items {
                        seen[i] += 1;
                    }
                }
                Oversized(i) => {
                    assert!(lengths[*i] > 64);
                    seen[*i] += 1;
                }
            }
        }
        for (i, &n) in seen.iter().enumerate() {
            assert_eq!(n, usize::from(lengths[i] > 0), "run {i}");
        }
        let order: Vec<usize> = chunks
            .iter()
            .flat_map(|c| match c {
                Packed(items) => items.clone(),
                Oversized(i) => vec![*i],
            })
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "input order preserved"
        );
    }

    #[test]
    fn sub_batches_cover_the_run() {
        assert_eq!(
            sub_batches(10, 4).collect::<Vec<_>>(),
            vec![(0, 4), (4, 4), (8, 2)]
        );
        assert_eq!(sub_batches(4, 4).collect::<Vec<_>>(), vec![(0, 4)]);
        assert_eq!(sub_batches(0, 4).count(), 0);
    }
}
