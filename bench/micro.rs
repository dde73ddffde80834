//! Per-call costs of the engine's hot loops in isolation, on a vocabulary-sized row (262,144
//! logits, as Gemma 3). Not a test: it asserts nothing and prints microseconds.
//!
//!     node scripts/cargo.js bench --bench micro
//!
//! (through scripts/cargo.js so the features and CPU flags match the addon's build).

use std::hint::black_box;
use std::time::Instant;

use llama_branch::engine::metrics;
use llama_branch::engine::sampling::pick;

/// Fastest of `reps` runs of `f`, in microseconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let logits: Vec<f32> = (0..262_144u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 4000) as f32 * 0.01 - 25.0)
        .collect();
    let mut candidates = Vec::new();
    let mut copy = Vec::with_capacity(logits.len());
    let rows = [
        (
            "log-sum-exp (vectorized)",
            best_of(200, || {
                black_box(metrics::log_sum_exp(black_box(&logits)));
            }),
        ),
        (
            "finite max",
            best_of(200, || {
                black_box(metrics::finite_max(black_box(&logits)));
            }),
        ),
        (
            "surprisal of one token",
            best_of(200, || {
                black_box(metrics::surprisal(
                    black_box(&logits),
                    17,
                    metrics::Base::Nats,
                ));
            }),
        ),
        (
            "top-40 preselection",
            best_of(200, || {
                pick::top_k_into(black_box(&logits), 40, &mut candidates);
            }),
        ),
        (
            "copy one row",
            best_of(200, || {
                copy.clear();
                copy.extend_from_slice(black_box(&logits));
                black_box(&copy);
            }),
        ),
    ];
    println!("per call on a 262,144-entry row (best of 200):");
    for (name, us) in rows {
        println!("  {name:<28} {us:>8.1} µs");
    }
}
