//! Decode planning: how runs of tokens are packed into `llama_decode` calls. Pure (only sizes
//! are read), so it is unit-tested without a model.

/// Size of one run: its tokens and the output rows it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSize {
    pub tokens: usize,
    pub outputs: usize,
}

/// What one decode (or, for an oversized run, one series of decodes) may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tokens per decode (`n_batch`).
    pub tokens: usize,
    /// Output rows per decode (`n_outputs_max`).
    pub outputs: usize,
    /// Decode a step of exactly two single-token runs as two 1-row decodes (when a 2-row batch
    /// was measured slower than two 1-row ones on this machine; see `calibrate`).
    pub split_pairs: bool,
}

/// One `llama_decode` worth of work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Several whole runs packed into one batch.
    Packed(Vec<usize>),
    /// One run larger than a decode: decoded alone over consecutive sub-batches.
    Oversized(usize),
}

/// Order-preserving next-fit packing. Empty runs are skipped; a run that does not fit the open
/// chunk starts a new one (no back-filling, so decode order equals input order).
pub fn pack(runs: &[RunSize], limits: Limits) -> Vec<Chunk> {
    let n_batch = limits.tokens.max(1);
    let max_outputs = limits.outputs.max(1);
    if limits.split_pairs && runs.len() == 2 && runs.iter().all(|r| r.tokens == 1) {
        return vec![Chunk::Packed(vec![0]), Chunk::Packed(vec![1])];
    }
    let mut chunks = Vec::new();
    let (mut open_tokens, mut open_outputs, mut open) = (0usize, 0usize, false);
    for (i, run) in runs.iter().enumerate() {
        if run.tokens == 0 {
            continue;
        }
        if run.tokens > n_batch || run.outputs > max_outputs {
            chunks.push(Chunk::Oversized(i));
            open = false;
            continue;
        }
        match chunks.last_mut() {
            Some(Chunk::Packed(items))
                if open
                    && open_tokens + run.tokens <= n_batch
                    && open_outputs + run.outputs <= max_outputs =>
            {
                items.push(i);
                open_tokens += run.tokens;
                open_outputs += run.outputs;
            }
            _ => {
                chunks.push(Chunk::Packed(vec![i]));
                (open_tokens, open_outputs, open) = (run.tokens, run.outputs, true);
            }
        }
    }
    chunks
}

/// Splits `len` tokens into consecutive `(start, count)` pieces of at most `n_batch`.
pub fn sub_batches(len: usize, n_batch: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(n_batch.max(1))
        .map(move |start| (start, n_batch.max(1).min(len - start)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Chunk::*;

    fn sizes(lengths: &[usize]) -> Vec<RunSize> {
        lengths
            .iter()
            .map(|&tokens| RunSize {
                tokens,
                outputs: usize::from(tokens > 0),
            })
            .collect()
    }

    fn limits(tokens: usize) -> Limits {
        Limits {
            tokens,
            outputs: 64,
            split_pairs: false,
        }
    }

    #[test]
    fn packs_in_order_without_backfilling() {
        let pack = |l: &[usize], n| pack(&sizes(l), limits(n));
        assert_eq!(
            pack(&[6, 6, 4], 10),
            vec![Packed(vec![0]), Packed(vec![1, 2])]
        );
        assert_eq!(
            pack(&[6, 11, 4], 10),
            vec![Packed(vec![0]), Oversized(1), Packed(vec![2])]
        );
        assert_eq!(pack(&[0, 3, 0, 3], 10), vec![Packed(vec![1, 3])]);
        assert_eq!(pack(&[10, 1], 10), vec![Packed(vec![0]), Packed(vec![1])]);
        assert_eq!(
            pack(&[5, 5, 5], 10),
            vec![Packed(vec![0, 1]), Packed(vec![2])]
        );
    }

    #[test]
    fn output_rows_limit_a_chunk_too() {
        let runs = sizes(&[1; 5]);
        let l = Limits {
            tokens: 512,
            outputs: 2,
            split_pairs: false,
        };
        assert_eq!(
            pack(&runs, l),
            vec![Packed(vec![0, 1]), Packed(vec![2, 3]), Packed(vec![4])]
        );
        let all = [RunSize {
            tokens: 3,
            outputs: 3,
        }];
        assert_eq!(
            pack(&all, l),
            vec![Oversized(0)],
            "more outputs than a decode allows"
        );
    }

    #[test]
    fn a_pair_of_single_tokens_splits_only_when_asked() {
        let pair = sizes(&[1, 1]);
        let mut l = limits(512);
        assert_eq!(pack(&pair, l), vec![Packed(vec![0, 1])]);
        l.split_pairs = true;
        assert_eq!(pack(&pair, l), vec![Packed(vec![0]), Packed(vec![1])]);
        assert_eq!(pack(&sizes(&[1, 1, 1]), l), vec![Packed(vec![0, 1, 2])]);
        assert_eq!(pack(&sizes(&[2, 1]), l), vec![Packed(vec![0, 1])]);
    }

    #[test]
    fn empty_inputs_yield_no_chunks() {
        assert!(pack(&[], limits(8)).is_empty());
        assert!(pack(&sizes(&[0, 0]), limits(8)).is_empty());
    }

    #[test]
    fn every_packed_chunk_respects_the_limit_and_every_run_appears_once() {
        let lengths: Vec<usize> = (0..200).map(|i| (i * 37 + 11) % 70).collect();
        let chunks = pack(&sizes(&lengths), limits(64));
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
