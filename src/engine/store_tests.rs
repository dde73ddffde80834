//! The store over the in-memory KV backend: leases, the branch tree, exact KV accounting and
//! all-or-nothing decodes, without a model.

use super::branch::BranchSampling;
use super::fake::FakeKv;
use super::handles::Handle;
use super::kv::KvBackend;
use super::pool::Pool;
use super::sampling::Chain;
use super::store::{BranchStore, CreateOptions, ForkOptions};
use crate::error::Error;
use crate::llama::Token;

pub(super) const N_VOCAB: i32 = 16;

pub(super) fn greedy() -> BranchSampling {
    BranchSampling::new(Chain::greedy(N_VOCAB).unwrap(), None)
}

fn setup(n_ctx: u32, n_seq: u32) -> (FakeKv, BranchStore, Pool) {
    (
        FakeKv::new(n_ctx, n_seq),
        BranchStore::new(n_seq, false),
        Pool::new(2),
    )
}

/// A root branch with `prompt` prefilled (also the fixture of engine/tree.rs's tests).
pub(super) fn root(kv: &mut FakeKv, store: &mut BranchStore, prompt: &[Token]) -> Handle {
    let h = store
        .create(
            kv,
            CreateOptions {
                position: 0,
                seq: None,
                sampling: greedy(),
                n_batch: None,
            },
        )
        .unwrap();
    store
        .prefill(kv, &[(h, prompt.to_vec())], None, &|| false)
        .unwrap();
    h
}

/// The store's accounting equals the cells the backend really holds, and every live (not
/// parked) branch's position is its sequence's end (also engine/park_tests.rs's check).
pub(super) fn assert_consistent(kv: &FakeKv, store: &BranchStore) {
    assert_eq!(
        store.kv_pressure(kv).cells_used,
        kv.cells_used(),
        "accounting"
    );
    for h in store.live_handles() {
        let b = store.get(h).unwrap();
        if !b.is_parked() {
            assert_eq!(kv.seq_pos_max(b.seq), b.position - 1, "branch {h} position");
        }
    }
}

fn step(kv: &mut FakeKv, store: &mut BranchStore, pool: &Pool, branches: &[Handle]) {
    let items: Vec<(Handle, Token)> = branches
        .iter()
        .map(|&h| (h, store.sample(h).unwrap().unwrap()))
        .collect();
    store.commit(kv, pool, &items, true, &|| false).unwrap();
}

#[test]
fn forks_share_cells_and_accounting_stays_exact_through_any_prune_order() {
    let (mut kv, mut store, pool) = setup(256, 6);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4, 5]);
    let kids: Vec<Handle> = (0..3)
        .map(|_| store.fork(&kv, r, ForkOptions::default()).unwrap())
        .collect();
    assert_eq!(store.kv_pressure(&kv).cells_used, 5, "forks copy nothing");
    for _ in 0..4 {
        step(&mut kv, &mut store, &pool, &kids);
        assert_consistent(&kv, &store);
    }
    let grandchild = store.fork(&kv, kids[1], ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[grandchild, r]);
    assert_consistent(&kv, &store);
    assert_eq!(store.get(kids[1]).unwrap().children, vec![grandchild]);
    store.prune(&kv, r).unwrap();
    assert_consistent(&kv, &store);
    assert_eq!(
        store.get(kids[0]).unwrap().parent,
        None,
        "children of a pruned root become roots"
    );
    store.prune_subtree(&kv, kids[1]).unwrap();
    assert!(!store.is_live(grandchild));
    assert_consistent(&kv, &store);
    store.retain_only(&kv, kids[2]).unwrap();
    assert_eq!(store.live_handles(), vec![kids[2]]);
    assert_consistent(&kv, &store);
    assert_eq!(store.available(&kv), 5);
}

#[test]
fn fork_at_shares_only_the_prefix_and_starts_without_logits() {
    let (mut kv, mut store, pool) = setup(256, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let opts = ForkOptions {
        position: Some(3),
        sampling: Some(greedy()),
        ..ForkOptions::default()
    };
    let c = store.fork(&kv, r, opts).unwrap();
    let child = store.get(c).unwrap();
    assert_eq!((child.position, child.has_logits()), (3, false));
    assert_eq!(kv.seq_pos_max(child.seq), 2);
    assert_eq!(store.sample(c).unwrap_err(), Error::NoLogits);
    assert_consistent(&kv, &store);
    store
        .prefill(&mut kv, &[(c, vec![9, 9])], None, &|| false)
        .unwrap();
    step(&mut kv, &mut store, &pool, &[c, r]);
    assert_consistent(&kv, &store);
    assert_eq!(store.kv_pressure(&kv).cells_used, 8 + 1 + 2 + 1);
    store.prune(&kv, r).unwrap();
    assert_eq!(
        store.kv_pressure(&kv).cells_used,
        3 + 2 + 1,
        "the child keeps only its prefix"
    );
    assert_consistent(&kv, &store);
    let bad = ForkOptions {
        position: Some(99),
        ..ForkOptions::default()
    };
    assert_eq!(
        store.fork(&kv, c, bad).unwrap_err().code(),
        "ERR_INVALID_ARG"
    );
}

#[test]
fn a_failed_commit_or_prefill_changes_nothing_anywhere() {
    let (mut kv, mut store, pool) = setup(1024, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    let b = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a, b]);
    let cells = kv.snapshot();
    let state = |s: &BranchStore, h: Handle| {
        let b = s.get(h).unwrap();
        (
            b.position,
            b.logits().unwrap().to_vec(),
            b.model_ppl.count(),
        )
    };
    let before: Vec<_> = [r, a, b].iter().map(|&h| state(&store, h)).collect();
    for fail_at in 0..3 {
        kv.fail_decode_after(fail_at);
        // Three runs of 200 tokens with nBatch 256: three decodes, the n-th one fails.
        let runs = vec![(r, vec![5; 200]), (a, vec![6; 200]), (b, vec![7; 200])];
        let err = store
            .prefill(&mut kv, &runs, Some(256), &|| false)
            .unwrap_err();
        assert_eq!(err.code(), "ERR_DECODE");
        assert_eq!(kv.snapshot(), cells, "prefill failing at decode {fail_at}");
    }
    kv.fail_decode_after(0);
    let items = [(a, 4), (b, 5)];
    assert_eq!(
        store
            .commit(&mut kv, &pool, &items, true, &|| false)
            .unwrap_err()
            .code(),
        "ERR_DECODE"
    );
    let cancelled = store
        .commit(&mut kv, &pool, &items, true, &|| true)
        .unwrap_err();
    assert_eq!(cancelled, Error::Aborted);
    let after: Vec<_> = [r, a, b].iter().map(|&h| state(&store, h)).collect();
    assert_eq!(after, before);
    assert_eq!(kv.snapshot(), cells);
    assert_consistent(&kv, &store);
}

#[test]
fn leases_run_out_and_come_back_and_a_full_cache_is_refused_before_decoding() {
    let (mut kv, mut store, pool) = setup(16, 2);
    let r = root(&mut kv, &mut store, &[1; 10]);
    let c = store.fork(&kv, r, ForkOptions::default()).unwrap();
    let third = store.fork(&kv, r, ForkOptions::default()).unwrap_err();
    assert_eq!(third, Error::NoFreeSequence { n_seq_max: 2 });
    let long = store
        .prefill(&mut kv, &[(c, vec![2; 7])], None, &|| false)
        .unwrap_err();
    assert_eq!(long.code(), "ERR_KV_FULL");
    assert_eq!(kv.decode_sizes().len(), 1, "refused before any decode");
    store.prune(&kv, c).unwrap();
    assert_eq!(store.available(&kv), 1);
    let again = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[again]);
    assert_consistent(&kv, &store);
}

#[test]
fn a_branch_named_twice_or_stale_is_refused() {
    let (mut kv, mut store, pool) = setup(64, 2);
    let r = root(&mut kv, &mut store, &[1, 2]);
    let twice = store.commit(&mut kv, &pool, &[(r, 1), (r, 2)], true, &|| false);
    assert_eq!(twice.unwrap_err().code(), "ERR_INVALID_ARG");
    store.prune(&kv, r).unwrap();
    assert_eq!(
        store
            .commit(&mut kv, &pool, &[(r, 1)], true, &|| false)
            .unwrap_err(),
        Error::BranchDisposed
    );
    assert_eq!(store.prune(&kv, r).unwrap_err(), Error::BranchDisposed);
    assert_eq!(kv.cells_used(), 0);
}

#[test]
fn destroy_keeps_the_cells_until_raw_calls_remove_them() {
    let (mut kv, mut store, _pool) = setup(64, 2);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let seq = store.destroy(&kv, r).unwrap();
    assert_eq!(store.available(&kv), 1, "the sequence stays reserved");
    assert_eq!(store.kv_pressure(&kv).cells_used, 3);
    kv.seq_rm(seq, -1, -1);
    assert_eq!(store.available(&kv), 2);
    assert_eq!(store.kv_pressure(&kv).cells_used, 0);
}

#[test]
fn a_branch_created_ahead_of_its_prefix_adopts_a_copy_that_ends_where_it_starts() {
    let (mut kv, mut store, pool) = setup(64, 3);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4]);
    let ahead = |store: &mut BranchStore, kv: &FakeKv, seq| {
        store.create(
            kv,
            CreateOptions {
                position: 4,
                seq: Some(seq),
                sampling: greedy(),
                n_batch: None,
            },
        )
    };
    let b = ahead(&mut store, &kv, 1).unwrap();
    let early = store
        .prefill(&mut kv, &[(b, vec![5])], None, &|| false)
        .unwrap_err();
    assert!(early.to_string().contains("kvSeqCopy"), "{early}");
    assert_eq!(
        store
            .fork(&kv, b, ForkOptions::default())
            .unwrap_err()
            .code(),
        "ERR_INVALID_ARG"
    );
    let short = store.adopt_copy(&kv, b, 0, 0, 2).unwrap_err();
    assert!(short.to_string().contains("ends at position 2"), "{short}");
    assert_eq!(kv.seq_pos_max(1), -1, "a refused copy is undone");
    store.adopt_copy(&kv, b, 0, -1, -1).unwrap();
    assert_eq!(
        store.kv_pressure(&kv).cells_used,
        4,
        "the adopted prefix is shared with its owner"
    );
    store
        .prefill(&mut kv, &[(b, vec![5])], None, &|| false)
        .unwrap();
    step(&mut kv, &mut store, &pool, &[b, r]);
    assert_consistent(&kv, &store);
    let again = store.adopt_copy(&kv, b, 0, -1, -1).unwrap_err();
    assert!(again.to_string().contains("leased"), "{again}");
    let unnamed = store.create(
        &kv,
        CreateOptions {
            position: 4,
            seq: None,
            sampling: greedy(),
            n_batch: None,
        },
    );
    assert!(unnamed
        .unwrap_err()
        .to_string()
        .contains("position must be 0"));
}

#[test]
fn on_a_sliding_window_model_fork_at_is_refused_once_the_parent_left_its_window() {
    let (mut kv, mut store, _pool) = setup(64, 4);
    kv.n_swa = 4;
    let short = root(&mut kv, &mut store, &[1, 2, 3]);
    let at = |position| ForkOptions {
        position: Some(position),
        sampling: Some(greedy()),
        ..ForkOptions::default()
    };
    let ok = store.fork(&kv, short, at(1)).unwrap();
    assert_eq!(
        store.get(ok).unwrap().position,
        1,
        "nothing has left a 4-position window yet"
    );
    let long = root(&mut kv, &mut store, &[1, 2, 3, 4, 5, 6]);
    let err = store.fork(&kv, long, at(2)).unwrap_err();
    assert_eq!(err.code(), "ERR_UNSUPPORTED");
    assert!(err.to_string().contains("sliding window of 4"), "{err}");
    let full = store.fork(&kv, long, at(6)).unwrap();
    assert_eq!(
        store.get(full).unwrap().position,
        6,
        "at the parent's own position it is a fork"
    );
    assert_consistent(&kv, &store);
}

// ---------------------------------------------------------------------------------------------
// Speculative steps (`commit_drafts`). The fake's greedy choice is always token 0 (its rows put
// the largest logit there), so a draft of zeros is accepted and any other token is rejected.

use super::speculate::{Drafted, Verified};

fn no_eog(_: Token) -> bool {
    false
}

fn drafted(h: Handle, token: Token, draft: &[Token]) -> Drafted {
    Drafted {
        branch: h,
        token,
        draft: draft.to_vec(),
    }
}

#[test]
fn a_verified_draft_leaves_the_branch_exactly_as_plain_commits_would() {
    for (draft, accepted) in [
        (vec![0, 0, 5, 0], 2),
        (vec![0, 0, 0], 3),
        (vec![7], 0),
        (vec![], 0),
    ] {
        let next = if draft.is_empty() { None } else { Some(0) };
        let (mut kv, mut store, pool) = setup(128, 4);
        let h = root(&mut kv, &mut store, &[1, 2, 3]);
        let t0 = store.sample(h).unwrap().unwrap(); // as the caller's produce would
        let verified = store
            .commit_drafts(&mut kv, &pool, &[drafted(h, t0, &draft)], &no_eog, &|| {
                false
            })
            .unwrap();
        assert_eq!(
            verified,
            vec![Verified { accepted, next }],
            "draft {draft:?}"
        );
        assert_consistent(&kv, &store);

        let (mut plain_kv, mut plain, _) = setup(128, 4);
        let p = root(&mut plain_kv, &mut plain, &[1, 2, 3]);
        for _ in 0..=accepted {
            step(&mut plain_kv, &mut plain, &pool, &[p]);
        }
        let (a, b) = (store.get(h).unwrap(), plain.get(p).unwrap());
        assert_eq!(a.position, b.position, "draft {draft:?}");
        assert_eq!(kv.snapshot(), plain_kv.snapshot(), "draft {draft:?}");
        assert_eq!(a.logits().unwrap(), b.logits().unwrap(), "draft {draft:?}");
        assert_eq!(a.model_ppl.count(), b.model_ppl.count());
        assert_eq!(a.model_ppl.value(), b.model_ppl.value());
        assert_eq!(a.sampling_ppl.value(), b.sampling_ppl.value());
        if !draft.is_empty() {
            assert_eq!(store.sample(h).unwrap(), verified[0].next);
        }
    }
}

#[test]
fn an_end_of_generation_token_is_never_accepted_from_a_draft() {
    let (mut kv, mut store, pool) = setup(128, 4);
    let h = root(&mut kv, &mut store, &[1, 2, 3]);
    let eog = |t: Token| t == 0;
    let verified = store
        .commit_drafts(&mut kv, &pool, &[drafted(h, 4, &[0, 0])], &eog, &|| false)
        .unwrap();
    assert_eq!(
        verified[0],
        Verified {
            accepted: 0,
            next: Some(0)
        }
    );
    assert_eq!(store.get(h).unwrap().position, 4);
    assert_consistent(&kv, &store);
}

#[test]
fn drafts_stay_in_their_own_branch_and_many_verify_in_one_decode() {
    let (mut kv, mut store, pool) = setup(256, 6);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4]);
    let kids: Vec<Handle> = (0..3)
        .map(|_| store.fork(&kv, r, ForkOptions::default()).unwrap())
        .collect();
    let decodes_before = kv.decode_sizes().len();
    let items = [
        drafted(kids[0], 0, &[0, 9, 9]),
        drafted(kids[1], 0, &[0, 0, 0, 0]),
        drafted(kids[2], 0, &[]),
    ];
    let verified = store
        .commit_drafts(&mut kv, &pool, &items, &no_eog, &|| false)
        .unwrap();
    assert_eq!(kv.decode_sizes().len(), decodes_before + 1, "one decode");
    assert_eq!(
        verified.iter().map(|v| v.accepted).collect::<Vec<_>>(),
        vec![1, 4, 0]
    );
    let positions: Vec<i32> = kids
        .iter()
        .map(|&k| store.get(k).unwrap().position)
        .collect();
    assert_eq!(positions, vec![6, 9, 5]);
    assert_eq!(store.get(r).unwrap().position, 4, "the parent is untouched");
    assert_consistent(&kv, &store);
}

#[test]
fn a_failed_cancelled_or_oversized_speculative_step_changes_nothing() {
    let (mut kv, mut store, pool) = setup(128, 4);
    let h = root(&mut kv, &mut store, &[1, 2, 3]);
    let before = (
        kv.snapshot(),
        store.get(h).unwrap().position,
        store.get(h).unwrap().model_ppl.count(),
        store.get(h).unwrap().logits().unwrap().to_vec(),
    );
    let unchanged = |kv: &FakeKv, store: &BranchStore| {
        let b = store.get(h).unwrap();
        assert_eq!(kv.snapshot(), before.0);
        assert_eq!(b.position, before.1);
        assert_eq!(b.model_ppl.count(), before.2);
        assert_eq!(b.logits().unwrap(), before.3.as_slice());
    };
    kv.fail_decode_after(0);
    let items = [drafted(h, 0, &[0, 0])];
    let failed = store.commit_drafts(&mut kv, &pool, &items, &no_eog, &|| false);
    assert!(matches!(failed, Err(Error::Decode { .. })), "{failed:?}");
    unchanged(&kv, &store);
    let cancelled = store.commit_drafts(&mut kv, &pool, &items, &no_eog, &|| true);
    assert!(matches!(cancelled, Err(Error::Aborted)), "{cancelled:?}");
    unchanged(&kv, &store);
    let long = [drafted(h, 0, &[0; 40])]; // the fake allows 32 output rows per decode
    let oversized = store.commit_drafts(&mut kv, &pool, &long, &no_eog, &|| false);
    assert!(
        matches!(oversized, Err(Error::InvalidArgument(_))),
        "{oversized:?}"
    );
    unchanged(&kv, &store);
    // and the branch still steps normally afterwards
    store
        .commit_drafts(&mut kv, &pool, &items, &no_eog, &|| false)
        .unwrap();
    assert_consistent(&kv, &store);
}

/// The fake backend's logits row after `token` at `pos` of `seq`.
fn fake_row(seq: i32, pos: i32, token: Token) -> Vec<f32> {
    let mut row = vec![0.0; N_VOCAB as usize];
    row[0] = FakeKv::logit0(seq, pos, token);
    row[token as usize % N_VOCAB as usize] += 1.0;
    row
}

fn logprob(row: &[f32], token: Token) -> f64 {
    -super::metrics::surprisal(row, token as usize, super::metrics::Base::Nats)
}

#[test]
fn a_scored_prefill_sums_each_tokens_log_probability_in_one_decode() {
    let (mut kv, mut store, _pool) = setup(256, 6);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let kids: Vec<Handle> = (0..3)
        .map(|_| store.fork(&kv, r, ForkOptions::default()).unwrap())
        .collect();
    let seq = |h: Handle| store.get(h).unwrap().seq;
    let snapshot = store.get(r).unwrap().logits().unwrap().to_vec();
    let (a, b, c) = (kids[0], kids[1], kids[2]);
    let (seq_a, seq_b) = (seq(a), seq(b));
    let decodes = kv.decode_sizes().len();
    let scores = store
        .prefill_scored(
            &mut kv,
            &[(a, vec![4, 5]), (b, vec![6, 7, 8]), (c, vec![9])],
            &[Some(0), Some(1), None],
            None,
            &|| false,
        )
        .unwrap();
    assert_eq!(
        kv.decode_sizes().len(),
        decodes + 1,
        "one decode for all three"
    );
    // One log-probability per scored token, in order.
    let want_a = [logprob(&snapshot, 4), logprob(&fake_row(seq_a, 3, 4), 5)];
    let want_b = [
        logprob(&fake_row(seq_b, 3, 6), 7),
        logprob(&fake_row(seq_b, 4, 7), 8),
    ];
    for (got, want) in [(&scores[0], &want_a[..]), (&scores[1], &want_b[..])] {
        let got = got.as_ref().unwrap();
        assert_eq!(got.len(), want.len(), "{scores:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{scores:?} vs {want:?}");
        }
    }
    assert_eq!(scores[2], None);
    // Each branch ends where a plain prefill would leave it: position and snapshot.
    assert_eq!(store.get(b).unwrap().position, 6);
    assert_eq!(
        store.get(b).unwrap().logits().unwrap(),
        fake_row(seq_b, 5, 8).as_slice()
    );
    assert_consistent(&kv, &store);
}

#[test]
fn a_scored_prefill_refuses_what_it_cannot_score_and_changes_nothing() {
    let (mut kv, mut store, _pool) = setup(256, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4]);
    let at = ForkOptions {
        position: Some(2),
        ..ForkOptions::default()
    };
    let no_logits = store.fork(&kv, r, at).unwrap();
    let cells = kv.snapshot();
    for (items, from) in [
        (vec![(no_logits, vec![5, 6])], vec![Some(0)]),
        (vec![(r, vec![5, 6])], vec![Some(2)]),
        (vec![(r, vec![5, 6])], vec![]),
    ] {
        let err = store
            .prefill_scored(&mut kv, &items, &from, None, &|| false)
            .unwrap_err();
        assert_eq!(err.code(), "ERR_INVALID_ARG", "{err}");
        assert_eq!(kv.snapshot(), cells);
        assert_eq!(store.get(r).unwrap().position, 4);
    }
    // From index 1 the branch needs no logits of its own: the first token only gives a row.
    let scores = store
        .prefill_scored(
            &mut kv,
            &[(no_logits, vec![5, 6])],
            &[Some(1)],
            None,
            &|| false,
        )
        .unwrap();
    let scored = scores[0].as_ref().unwrap();
    assert_eq!(scored.len(), 1);
    assert!(scored[0].is_finite() && scored[0] <= 0.0);
    assert_consistent(&kv, &store);
}

#[test]
fn create_loaded_adopts_loaded_cells_and_undoes_a_failed_load() {
    let (mut kv, mut store, _pool) = setup(64, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4, 5]);
    let src = store.get(r).unwrap().seq;
    let free = store.available(&kv);
    // A load that fails (a corrupt state) or writes nothing leaves no lease and no cells behind.
    let err = store
        .create_loaded(&kv, greedy(), |seq| {
            kv.seq_cp(src, seq, -1, -1);
            Err(Error::State("corrupt".into()))
        })
        .unwrap_err();
    assert_eq!(err.code(), "ERR_STATE");
    let err = store.create_loaded(&kv, greedy(), |_| Ok(())).unwrap_err();
    assert_eq!(err.code(), "ERR_STATE");
    assert_eq!(store.available(&kv), free);
    assert_eq!(kv.cells_used(), 5);
    // A good load: the branch starts where the cells end, and owns them once the source goes.
    let h = store
        .create_loaded(&kv, greedy(), |seq| {
            kv.seq_cp(src, seq, -1, -1);
            Ok(())
        })
        .unwrap();
    assert_eq!(store.get(h).unwrap().position, 5);
    assert_eq!(store.available(&kv), free - 1);
    store.prune(&kv, r).unwrap();
    assert_consistent(&kv, &store);
}
