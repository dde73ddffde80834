//! Warming a GPU backend up before users wait on it. Vulkan (and CUDA's graphs, Metal's
//! pipelines) compile the kernels a graph needs the first time a graph of that shape runs, so
//! the first decode of each new batch size stalls for up to seconds. A context on such a device
//! decodes one throwaway batch of each size class it will meet, right after creation, so that the
//! compiles happen then (in the background, between the user's own operations) instead of in
//! the middle of serving.
//!
//! Which sizes: ggml-vulkan picks matrix-vector kernels with one pipeline per column count up to
//! 8, then matrix-matrix kernels whose tile size and split changes at thresholds in the token
//! count (32, 64, then by how many tiles fill the device). One decode on each side of every
//! power of two up to the largest batch covers every class these thresholds make; attention,
//! normalisation and the output head follow the same token counts.

use super::kv::KvBackend;
use super::leases::LeasePool;
use crate::llama::SeqId;

/// Columns up to which ggml-vulkan uses matrix-vector kernels, one pipeline per count.
const VECTOR_KERNEL_COLUMNS: u32 = 8;

/// The token counts to decode once each, ascending: every count up to the matrix-vector
/// limit, then each power of two and the count just above it, up to `max_tokens` (included).
pub fn warm_up_sizes(max_tokens: u32) -> Vec<u32> {
    if max_tokens == 0 {
        return Vec::new();
    }
    let mut sizes: Vec<u32> = (1..=VECTOR_KERNEL_COLUMNS.min(max_tokens)).collect();
    let mut power = VECTOR_KERNEL_COLUMNS;
    while power < max_tokens {
        sizes.push(power + 1);
        power = power.saturating_mul(2);
        sizes.push(power.min(max_tokens));
    }
    sizes.dedup();
    sizes.retain(|&n| n <= max_tokens);
    sizes
}

/// A sequence a warm-up decode may write and then clear without touching anyone's cells: one
/// no branch leases and that holds no cells, the one the lease pool would hand out last.
/// The caller runs the decode and the removal in one worker operation, so nothing else can
/// lease the id meanwhile and the pool's order is left as it was.
pub fn scratch_sequence(leases: &LeasePool, kv: &impl KvBackend) -> Option<SeqId> {
    leases
        .vacant_in_order()
        .rev()
        .find(|&seq| kv.seq_pos_max(seq) < 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::decode::{decode_runs, limits_of, Output, Run};
    use crate::engine::fake::FakeKv;
    use crate::llama::Batch;

    #[test]
    fn sizes_cover_each_vector_width_and_both_sides_of_every_power_of_two() {
        assert_eq!(
            warm_up_sizes(512),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512]
        );
        assert_eq!(
            warm_up_sizes(40),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33, 40]
        );
        assert_eq!(warm_up_sizes(3), vec![1, 2, 3]);
        assert_eq!(warm_up_sizes(9), vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert!(warm_up_sizes(0).is_empty());
        let big = warm_up_sizes(u32::MAX);
        assert!(big.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*big.last().unwrap(), u32::MAX);
    }

    #[test]
    fn scratch_sequence_is_vacant_and_empty_and_last_in_line() {
        let mut leases = LeasePool::new(4);
        let mut kv = FakeKv::new(64, 4);
        // Fresh pool: ids are handed out 0, 1, 2, 3; the scratch is the last one, 3.
        assert_eq!(scratch_sequence(&leases, &kv), Some(3));
        // A raw decode left cells in 3: it is skipped.
        let run = Run {
            seq: 3,
            start: 0,
            tokens: &[1, 2, 3],
            output: Output::None,
        };
        let limits = limits_of(&kv, false);
        decode_runs(
            &mut kv,
            &mut Batch::default(),
            &[run],
            limits,
            &|| false,
            &mut |_, _| Ok(()),
        )
        .unwrap();
        assert_eq!(scratch_sequence(&leases, &kv), Some(2));
        leases.acquire_exact(2);
        leases.acquire_exact(1);
        leases.acquire_exact(0);
        assert_eq!(scratch_sequence(&leases, &kv), None);
    }
}
