//! Parking over the in-memory KV backend: what a parked branch gives back, what it keeps, that
//! resume puts it back exactly, and that every refusal changes nothing.

use super::fake::FakeKv;
use super::fingerprint::Fingerprint;
use super::handles::Handle;
use super::pool::Pool;
use super::store::{BranchStore, ForkOptions};
use super::store_tests::{assert_consistent, root};
use crate::error::Error;
use crate::llama::Token;

fn setup(n_ctx: u32, n_seq: u32) -> (FakeKv, BranchStore, Pool) {
    (
        FakeKv::new(n_ctx, n_seq),
        BranchStore::new(n_seq, false),
        Pool::new(2),
    )
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        model: 7,
        model_name: "fake".into(),
        state_format: 1,
        kv: "f16".into(),
    }
}

fn step(kv: &mut FakeKv, store: &mut BranchStore, pool: &Pool, branches: &[Handle]) -> Vec<Token> {
    let items: Vec<(Handle, Token)> = branches
        .iter()
        .map(|&h| (h, store.sample(h).unwrap().unwrap()))
        .collect();
    store.commit(kv, pool, &items, true, &|| false).unwrap();
    items.into_iter().map(|(_, t)| t).collect()
}

/// The spill file of a parked, spilled branch.
fn spill_file(store: &BranchStore, h: Handle) -> std::path::PathBuf {
    let parked = store.parked(h).unwrap().expect("parked");
    parked.file().expect("spilled").to_path_buf()
}

fn code(e: Error) -> &'static str {
    e.code()
}

#[test]
fn a_parked_fork_gives_back_its_lease_and_own_cells_and_resumes_where_it_was() {
    let (mut kv, mut store, pool) = setup(256, 3);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4, 5]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a]);
    step(&mut kv, &mut store, &pool, &[a]);
    let next = store.get(a).unwrap().logits().unwrap().to_vec();
    assert_eq!(kv.cells_used(), 7);
    store.park(&kv, &[a]).unwrap();
    assert_eq!(kv.cells_used(), 5, "only the fork's own 2 cells left");
    assert_eq!(store.available(&kv), 2, "its lease is free");
    let p = store.parked(a).unwrap().unwrap();
    assert_eq!((p.shared, p.own), (5, 2));
    assert_consistent(&kv, &store);
    assert_eq!(store.park_stats().parked, 1);

    store.resume(&kv, &[a]).unwrap();
    assert!(!store.get(a).unwrap().is_parked());
    assert_eq!(store.get(a).unwrap().position, 7);
    assert_eq!(
        store.get(a).unwrap().logits().unwrap(),
        &next[..],
        "the snapshot is the same"
    );
    assert_eq!(kv.cells_used(), 7);
    assert_eq!(
        store.kv_pressure(&kv).cells_used,
        7,
        "the prefix is shared again, counted once"
    );
    assert_consistent(&kv, &store);
    step(&mut kv, &mut store, &pool, &[a, r]);
    assert_consistent(&kv, &store);
}

#[test]
fn a_branch_named_twice_in_one_park_is_parked_once_and_keeps_its_cells() {
    let (mut kv, mut store, pool) = setup(256, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    let b = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a, b]);
    store.park(&kv, &[a, b, a]).unwrap();
    let p = store.parked(a).unwrap().unwrap();
    assert_eq!(
        (p.shared, p.own),
        (3, 1),
        "the first park's record, not an empty second one"
    );
    store.resume(&kv, &[a, b]).unwrap();
    assert_eq!(store.get(a).unwrap().position, 4);
    assert_consistent(&kv, &store);
    step(&mut kv, &mut store, &pool, &[a, b]);
    assert_consistent(&kv, &store);
}

#[test]
fn every_kv_operation_on_a_parked_branch_is_err_branch_parked_and_changes_nothing() {
    let (mut kv, mut store, pool) = setup(64, 2);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    store.park(&kv, &[r]).unwrap();
    assert_eq!(code(store.sample(r).unwrap_err()), "ERR_BRANCH_PARKED");
    assert_eq!(
        code(store.fork(&kv, r, ForkOptions::default()).unwrap_err()),
        "ERR_BRANCH_PARKED"
    );
    let commit = store.commit(&mut kv, &pool, &[(r, 1)], true, &|| false);
    assert_eq!(code(commit.unwrap_err()), "ERR_BRANCH_PARKED");
    let prefill = store.prefill(&mut kv, &[(r, vec![4])], None, &|| false);
    assert_eq!(code(prefill.unwrap_err()), "ERR_BRANCH_PARKED");
    assert_eq!(
        code(store.park(&kv, &[r]).unwrap_err()),
        "ERR_BRANCH_PARKED",
        "parked twice"
    );
    assert_eq!(
        code(store.retain_only(&kv, r).unwrap_err()),
        "ERR_BRANCH_PARKED"
    );
    assert_eq!(
        code(store.destroy(&kv, r).unwrap_err()),
        "ERR_BRANCH_PARKED"
    );
    assert_eq!(kv.cells_used(), 0);
    assert_eq!(store.get(r).unwrap().position, 3);
    store.resume(&kv, &[r]).unwrap();
    assert_eq!(
        code(store.resume(&kv, &[r]).unwrap_err()),
        "ERR_INVALID_ARG"
    );
    step(&mut kv, &mut store, &pool, &[r]);
    assert_consistent(&kv, &store);
}

#[test]
fn resuming_a_child_resumes_its_parked_parents_first() {
    let (mut kv, mut store, pool) = setup(256, 3);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a]);
    let b = store.fork(&kv, a, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[b]);
    store.park(&kv, &[r, b, a]).unwrap(); // in any order: children go first
    assert_eq!(kv.cells_used(), 0);
    assert_eq!(store.available(&kv), 3);
    let ps = |h| store.parked(h).unwrap().map(|p| (p.shared, p.own)).unwrap();
    assert_eq!(
        (ps(r), ps(a), ps(b)),
        ((0, 4), (4, 1), (5, 1)),
        "each keeps only its own cells"
    );
    let resumed = store.resume(&kv, &[b]).unwrap();
    assert_eq!(resumed, vec![r, a, b], "parents first");
    assert_eq!(kv.cells_used(), 6);
    assert_consistent(&kv, &store);
    step(&mut kv, &mut store, &pool, &[r, a, b]);
    assert_consistent(&kv, &store);
}

#[test]
fn a_pruned_parent_a_parked_child_needs_stays_parked_until_the_child_is_back() {
    let (mut kv, mut store, pool) = setup(256, 3);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a]);
    store.park(&kv, &[a]).unwrap();
    assert_eq!(store.prune(&kv, r).unwrap(), vec![r]);
    assert!(
        store.is_ghost(r) && store.get(r).unwrap().is_parked(),
        "kept, parked, for a"
    );
    assert_eq!(
        (kv.cells_used(), store.available(&kv)),
        (0, 3),
        "its sequence and cells are free"
    );
    assert_eq!(
        code(store.destroy(&kv, a).unwrap_err()),
        "ERR_BRANCH_PARKED"
    );
    assert_eq!(
        store.resume(&kv, &[a]).unwrap(),
        vec![a],
        "the ghost comes back for a, then goes"
    );
    assert!(!store.is_live(r) && !store.is_ghost(r));
    assert_eq!(store.get(a).unwrap().position, 4);
    assert_eq!(kv.cells_used(), 4);
    assert_consistent(&kv, &store);
    step(&mut kv, &mut store, &pool, &[a]);
    // A ghost with two parked children: resuming one brings it back for a moment, and it goes
    // parked again for the other, holding no lease.
    let b = store.fork(&kv, a, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[b]);
    let c = store.fork(&kv, a, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[c]);
    store.park(&kv, &[b, c, a]).unwrap();
    store.prune(&kv, a).unwrap();
    assert!(store.is_ghost(a));
    assert_eq!(store.resume(&kv, &[b]).unwrap(), vec![b]);
    assert!(
        store.is_ghost(a) && store.get(a).unwrap().is_parked(),
        "still needed by c"
    );
    assert_eq!(store.available(&kv), 2, "only b holds a lease");
    store.resume(&kv, &[c]).unwrap();
    assert!(!store.is_live(a), "freed once nobody needs it");
    assert_consistent(&kv, &store);
    // A parked subtree goes with its root.
    store.park(&kv, &[b]).unwrap();
    let d = store.fork(&kv, c, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[d]);
    store.park(&kv, &[d]).unwrap();
    store.prune_subtree(&kv, c).unwrap();
    store.prune(&kv, b).unwrap();
    assert!(!store.is_live(c) && !store.is_live(d));
    assert_eq!(kv.cells_used(), 0);
    assert_eq!(store.park_stats().parked, 0);
}

#[test]
fn resume_is_refused_whole_without_free_sequences_or_cells() {
    let (mut kv, mut store, pool) = setup(8, 2);
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    store.park(&kv, &[r]).unwrap();
    let s1 = root(&mut kv, &mut store, &[1]);
    let s2 = root(&mut kv, &mut store, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(
        code(store.resume(&kv, &[r]).unwrap_err()),
        "ERR_NO_FREE_SEQUENCE"
    );
    store.prune(&kv, s1).unwrap();
    assert_eq!(
        code(store.resume(&kv, &[r]).unwrap_err()),
        "ERR_KV_FULL",
        "6 of 8 cells used, 3 needed"
    );
    assert!(store.get(r).unwrap().is_parked());
    store.prune(&kv, s2).unwrap();
    store.resume(&kv, &[r]).unwrap();
    step(&mut kv, &mut store, &pool, &[r]);
    assert_consistent(&kv, &store);
}

#[test]
fn beyond_the_ram_budget_parked_state_spills_to_a_file_and_comes_back_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("llama-branch-park-test-{}", std::process::id()));
    let (mut kv, mut store, pool) = setup(256, 2);
    store
        .set_spill(Some(0), Some(dir.clone()), fingerprint())
        .unwrap();
    let r = root(&mut kv, &mut store, &[1, 2, 3]);
    let a = store.fork(&kv, r, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[a]);
    let snapshot = store.get(a).unwrap().logits().unwrap().to_vec();
    store.park(&kv, &[a]).unwrap();
    let file = spill_file(&store, a);
    assert!(file.exists());
    let stats = store.park_stats();
    assert_eq!((stats.spilled, stats.ram_bytes), (1, 0));
    store.resume(&kv, &[a]).unwrap();
    assert!(!file.exists(), "the file goes once its branch is back");
    assert_eq!(store.get(a).unwrap().logits().unwrap(), &snapshot[..]);
    assert_consistent(&kv, &store);

    // A truncated file: ERR_STATE_CORRUPT, and the branch stays parked; prune removes the file.
    store.park(&kv, &[a]).unwrap();
    let file = spill_file(&store, a);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();
    assert_eq!(
        code(store.resume(&kv, &[a]).unwrap_err()),
        "ERR_STATE_CORRUPT"
    );
    assert!(store.get(a).unwrap().is_parked());
    assert_eq!(
        store.available(&kv),
        1,
        "the failed resume gave its lease back"
    );
    assert_consistent(&kv, &store);
    store.prune(&kv, a).unwrap();
    assert!(!file.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_search_holds_many_more_nodes_than_sequences() {
    let (mut kv, mut store, pool) = setup(4096, 4);
    let r = root(&mut kv, &mut store, &[1, 2, 3, 4]);
    let mut parked = Vec::new();
    for _ in 0..40 {
        let c = store.fork(&kv, r, ForkOptions::default()).unwrap();
        step(&mut kv, &mut store, &pool, &[c]);
        store.park(&kv, &[c]).unwrap();
        parked.push(c);
    }
    assert_eq!(store.park_stats().parked, 40);
    assert_eq!(kv.cells_used(), 4, "only the root's cells are in the cache");
    for chunk in parked.chunks(3) {
        store.resume(&kv, chunk).unwrap();
        step(&mut kv, &mut store, &pool, chunk);
        assert_consistent(&kv, &store);
        store.park(&kv, chunk).unwrap();
    }
    assert!(parked.iter().all(|&h| store.get(h).unwrap().position == 6));
}

#[test]
fn pressure_without_idle_branches_counts_what_the_others_hold() {
    let (mut kv, mut store, pool) = setup(256, 6);
    let cached = root(&mut kv, &mut store, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let longer = store.fork(&kv, cached, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[longer]);
    let request = store.fork(&kv, cached, ForkOptions::default()).unwrap();
    step(&mut kv, &mut store, &pool, &[request]);
    step(&mut kv, &mut store, &pool, &[request]);
    let all = store.kv_pressure(&kv).cells_used;
    assert_eq!(all, 8 + 1 + 2);
    let idle = store
        .kv_pressure_without(&kv, &[cached, longer, cached])
        .unwrap();
    assert_eq!(
        idle.cells_used,
        8 + 2,
        "the request keeps the prefix it forked"
    );
    assert_eq!(idle.remaining, 256 - 10);
    store.park(&kv, &[request]).unwrap();
    let parked = store
        .kv_pressure_without(&kv, &[cached, longer, request])
        .unwrap();
    assert_eq!(parked.cells_used, 0, "a parked branch holds no cells");
    assert_eq!(
        store.kv_pressure(&kv).cells_used,
        8 + 1,
        "nothing was pruned"
    );
    store.prune(&kv, longer).unwrap();
    assert!(matches!(
        store.kv_pressure_without(&kv, &[longer]),
        Err(Error::BranchDisposed)
    ));
}
