//! Branch trees that save and restore: a branch with all its live descendants — positions, KV
//! cells, sampler state (RNG, penalty/DRY windows), grammar state, logits snapshots and
//! perplexities — as `tree_file::SavedBranch`es, and back onto fresh sequences.
//!
//! Each shared prefix is stored once: a child saves only its cells beyond what it shares with
//! its parent (copied to a scratch sequence, saved from there); on restore its own cells are
//! loaded into its new sequence and the parent's prefix is tagged onto it with `seq_cp`, so the
//! restored tree shares cells exactly as the saved one did.
//!
//! llama.cpp cannot serialise a sampler, so sampler state is carried as what determines it:
//! the seed and number of draws of the random stage, and the tokens accepted since the chain and
//! the grammar were built (replayed). Mirostat and XTC are refused (`Chain::check_restorable`).
//!
//! Images (engine/media.rs) need nothing but their record: an image's cells are KV cells like
//! any other and come back with the branch's state, and each branch's `ImageSpan`s (range and
//! SHA-256) are saved beside it and given back on restore. So a context without a projector
//! restores a tree whose branches hold images, and goes on from them.

use std::collections::HashMap;

use super::branch::{BranchSampling, BranchState, GrammarSpec, History};
use super::handles::Handle;
use super::kv::KvBackend;
use super::metrics::Perplexity;
use super::sampling::{Chain, SamplingConfig};
use super::segments::RunRef;
use super::store::BranchStore;
use super::tree_file::{SavedBranch, SavedGrammar, SavedLogits, SavedSampling};
use crate::error::{Error, Result};
use crate::llama::{Model, Pos, Sampler, SeqId};

/// Cells two branches share: the common prefix of their run references (a fork references its
/// parent's runs, so equal ids in the same places are the same cells).
fn shared_cells(a: &[RunRef], b: &[RunRef]) -> u32 {
    let mut shared = 0;
    for (x, y) in a.iter().zip(b) {
        if x.id != y.id {
            break;
        }
        shared += x.used.min(y.used);
        if x.used != y.used {
            break;
        }
    }
    shared
}

impl BranchStore {
    /// `root` and its live descendants, parents before children (depth first, children in
    /// the order they were forked).
    pub fn subtree_order(&self, root: Handle) -> Result<Vec<Handle>> {
        self.get(root)?;
        let mut order = Vec::new();
        let mut stack = vec![root];
        while let Some(h) = stack.pop() {
            order.push(h);
            if let Some(b) = self.branches.get(h) {
                stack.extend(b.children.iter().rev().copied());
            }
        }
        Ok(order)
    }

    /// Everything needed to rebuild `root`'s tree elsewhere (see the module doc). Reads only:
    /// the scratch sequence it borrows is empty again and given back whatever happens.
    pub fn save_tree(&mut self, kv: &impl KvBackend, root: Handle) -> Result<Vec<SavedBranch>> {
        let order = self.subtree_order(root)?;
        for &h in &order {
            let b = self.get(h)?;
            b.check_has_prefix()?;
            Chain::check_restorable(b.config())?;
            if b.sampling.grammar.is_some() && b.sampling.grammar_spec.is_none() {
                return Err(Error::Unsupported(
                    "a branch's grammar was set without its source, so it cannot be saved".into(),
                ));
            }
            b.check_cells_end(kv, "such a tree cannot be saved")?;
        }
        // Without a spare sequence every branch is saved whole: larger, never refused.
        let scratch = self.lease(kv, None).ok();
        let result = self.save_each(kv, &order, scratch);
        if let Some(s) = scratch {
            kv.seq_rm(s, -1, -1);
            self.release_lease(s);
        }
        result
    }

    fn save_each(
        &self,
        kv: &impl KvBackend,
        order: &[Handle],
        scratch: Option<SeqId>,
    ) -> Result<Vec<SavedBranch>> {
        let index: HashMap<Handle, u32> = order
            .iter()
            .enumerate()
            .map(|(i, &h)| (h, i as u32))
            .collect();
        let mut out = Vec::with_capacity(order.len());
        for (i, &h) in order.iter().enumerate() {
            let b = self.get(h)?;
            let parent = if i == 0 {
                None
            } else {
                b.parent.and_then(|p| index.get(&p).copied())
            };
            let parent_state = parent.map(|p| self.get(order[p as usize])).transpose()?;
            let shared = match (parent_state, scratch) {
                (Some(p), Some(_)) => self.shareable(kv, p, b),
                _ => 0,
            };
            let kv_bytes = if b.position as u32 == shared || b.held() == 0 {
                Vec::new()
            } else if shared == 0 {
                kv.seq_state(b.seq)?
            } else {
                let s = scratch.expect("shared cells need the scratch sequence");
                kv.seq_rm(s, -1, -1);
                kv.seq_cp(b.seq, s, shared as Pos, -1);
                let state = kv.seq_state(s);
                kv.seq_rm(s, -1, -1);
                state?
            };
            let logits = match (b.snapshot(), parent_state.and_then(|p| p.snapshot())) {
                (None, _) => SavedLogits::None,
                (Some(own), Some(theirs)) if own == theirs => SavedLogits::SameAsParent,
                (Some(own), _) => SavedLogits::Own(own.to_vec()),
            };
            out.push(SavedBranch {
                parent,
                position: b.position,
                fork_head: b.fork_head,
                n_batch: b.n_batch,
                shared,
                cells: b.held().max(0) as u32,
                kv: kv_bytes,
                logits,
                model_ppl: b.model_ppl.parts(),
                sampling_ppl: b.sampling_ppl.parts(),
                steer: b.steer.clone(),
                sampling: saved_sampling(&b.sampling),
                images: b.images.clone(),
            });
        }
        Ok(out)
    }

    /// How many of `child`'s first cells a restored `parent` can give it (0: save it whole).
    pub(super) fn shareable(
        &self,
        kv: &impl KvBackend,
        parent: &BranchState,
        child: &BranchState,
    ) -> u32 {
        // Prefix sharing assumes both sequences start at position 0.
        if parent.position != parent.held() || child.position != child.held() {
            return 0;
        }
        let shared = shared_cells(&parent.runs, &child.runs)
            .min(parent.position as u32)
            .min(child.position as u32);
        let n_swa = kv.n_swa();
        if n_swa > 0 && shared > 0 {
            // A sliding-window model keeps only a window of recent cells per sequence in its
            // SWA cache. The child needs the window below `shared` unless it has moved a whole
            // window past it; the restored parent still holds that window only if it has not
            // moved on (or never left its first window). Otherwise the child goes whole.
            let child_needs = (child.position as u32) < shared + n_swa;
            let parent_has = parent.position as u32 == shared || (parent.position as u32) < n_swa;
            if child_needs && !parent_has {
                return 0;
            }
        }
        shared
    }

    /// Rebuilds a saved tree on fresh sequences; the handles come back in the saved order.
    /// All or nothing: the sequences and cells needed are checked first, and on any failure
    /// every branch made so far is pruned again.
    pub fn restore_tree(
        &mut self,
        kv: &impl KvBackend,
        saved: &[SavedBranch],
        samplings: Vec<BranchSampling>,
    ) -> Result<Vec<Handle>> {
        let needed = saved.len() as u32;
        let free = self.available(kv);
        if free < needed {
            return Err(Error::NotEnoughSequences {
                what: "restoreTree",
                needed,
                free,
                n_seq_max: self.capacity(),
            });
        }
        let cells: u64 = saved.iter().map(|b| (b.cells - b.shared) as u64).sum();
        let remaining = self.kv_pressure(kv).remaining as u64;
        if cells > remaining {
            return Err(Error::KvFull(format!(
                "restoreTree needs {cells} cells for the tree's own tokens, {remaining} are free"
            )));
        }
        let mut made: Vec<Handle> = Vec::with_capacity(saved.len());
        for (i, (b, sampling)) in saved.iter().zip(samplings).enumerate() {
            match self.restore_one(kv, i, b, sampling, &made) {
                Ok(h) => made.push(h),
                Err(e) => {
                    for &h in made.iter().rev() {
                        let _ = self.prune(kv, h);
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    fn restore_one(
        &mut self,
        kv: &impl KvBackend,
        i: usize,
        b: &SavedBranch,
        sampling: BranchSampling,
        made: &[Handle],
    ) -> Result<Handle> {
        let parent = b.parent.map(|p| made[p as usize]);
        let seq = self.lease(kv, None)?;
        let placed = self.place_cells(kv, i, b, seq, parent);
        if let Err(e) = placed {
            kv.seq_rm(seq, -1, -1);
            self.release_lease(seq);
            return Err(e);
        }
        // From the file, not `seq_extent`: on a sliding-window model llama.cpp's lowest
        // position of a sequence is its window cache's, not where its cells begin.
        let own = b.cells - b.shared;
        let mut runs = match parent {
            Some(p) if b.shared > 0 => {
                let parent_runs = self.get(p)?.runs.clone();
                self.segments.share_prefix(&parent_runs, b.shared)
            }
            _ => Vec::new(),
        };
        self.segments.append(&mut runs, own);
        let n_batch = b.n_batch.clamp(1, kv.n_batch());
        let n_vocab = kv.n_vocab() as usize;
        let mut state = BranchState::new(seq, b.position, n_batch, sampling, n_vocab, runs.clone());
        state.fork_head = b.fork_head;
        state.parent = parent;
        state.model_ppl = Perplexity::from_parts(b.model_ppl.0, b.model_ppl.1);
        state.sampling_ppl = Perplexity::from_parts(b.sampling_ppl.0, b.sampling_ppl.1);
        state.steer = b.steer.clone();
        // The image cells came back with the rest; the branch knows them as images again
        // (forks keep those below them, none starts inside one).
        state.images = b.images.clone();
        let logits = match &b.logits {
            SavedLogits::None => None,
            SavedLogits::Own(row) => Some(row.clone()),
            SavedLogits::SameAsParent => match parent {
                Some(p) => self.get(p)?.snapshot().map(<[f32]>::to_vec),
                None => None,
            },
        };
        state.restore_snapshot(logits, n_vocab);
        match self.insert(state) {
            Ok(h) => {
                if let Some(p) = parent {
                    self.get_mut(p)?.children.push(h);
                }
                Ok(h)
            }
            Err(e) => {
                self.segments.release_all(&runs);
                kv.seq_rm(seq, -1, -1);
                self.release_lease(seq);
                Err(e)
            }
        }
    }

    /// Loads branch `i`'s own cells into `seq`, then tags its parent's prefix onto it.
    fn place_cells(
        &self,
        kv: &impl KvBackend,
        i: usize,
        b: &SavedBranch,
        seq: SeqId,
        parent: Option<Handle>,
    ) -> Result<()> {
        kv.seq_rm(seq, -1, -1);
        if !b.kv.is_empty() {
            if b.kv.len() < 8 || b.kv[..4] != crate::llama::SEQ_STATE_MAGIC.to_le_bytes() {
                return Err(Error::State(format!(
                    "branch {i} of the tree file holds no llama.cpp sequence state"
                )));
            }
            let mut data = b.kv.clone();
            data[4..8].copy_from_slice(&seq.to_le_bytes());
            let read = kv.set_seq_state(seq, &data);
            if read != data.len() {
                return Err(Error::State(format!(
                    "llama.cpp refused the cells of branch {i} of the tree file (corrupt, or too many for the free KV cells); nothing was restored"
                )));
            }
        }
        if let (Some(p), true) = (parent, b.shared > 0) {
            let p = self.get(p)?;
            if (p.position as u32) < b.shared {
                return Err(Error::State(format!(
                    "branch {i} shares {} cells with a parent at position {}",
                    b.shared, p.position
                )));
            }
            kv.seq_cp(p.seq, seq, -1, b.shared as Pos);
        }
        let end = kv.seq_pos_max(seq) + 1;
        if end != b.position || end as u32 > kv.n_ctx() {
            return Err(Error::State(format!(
                "branch {i}'s restored cells end at position {end}, but it was saved at position {}; nothing was restored",
                b.position
            )));
        }
        Ok(())
    }
}

fn saved_sampling(s: &BranchSampling) -> SavedSampling {
    let (seed, draws) = s.chain.rng_state();
    SavedSampling {
        config: s.chain.config().clone(),
        seed,
        draws,
        accepted: s.history.chain.clone(),
        grammar: s.grammar_spec.as_ref().map(|g| SavedGrammar {
            gbnf: g.gbnf.clone(),
            trigger_patterns: g.trigger_patterns.clone(),
            trigger_tokens: g.trigger_tokens.clone(),
            accepted: s.history.grammar.clone(),
        }),
    }
}

/// A branch's sampling state as it was saved: the chain rebuilt and replayed, the grammar
/// rebuilt from its source and given the tokens it had accepted. `model` is needed for DRY and
/// grammars. A token the rebuilt grammar refuses is `ERR_STATE_CORRUPT` (the file does not
/// match).
pub fn restore_sampling(
    saved: &SavedSampling,
    model: Option<&Model>,
    n_vocab: i32,
    n_ctx: u32,
) -> Result<BranchSampling> {
    let chain = Chain::restore(
        SamplingConfig::clone(&saved.config),
        model,
        n_vocab,
        n_ctx,
        saved.seed,
        saved.draws,
        &saved.accepted,
    )?;
    let grammar = match (&saved.grammar, model) {
        (None, _) => None,
        (Some(_), None) => return Err(Error::Internal("grammars need the model".into())),
        (Some(g), Some(model)) => {
            let lazy = (!g.trigger_patterns.is_empty() || !g.trigger_tokens.is_empty())
                .then_some((g.trigger_patterns.as_slice(), g.trigger_tokens.as_slice()));
            let mut sampler = Sampler::grammar(model, &g.gbnf, lazy)?;
            for &t in &g.accepted {
                if !super::sampling::pick::grammar_allows(&mut sampler, t, 0.0)
                    || sampler.accept(t).is_err()
                {
                    return Err(Error::StateCorrupt(format!(
                        "the saved grammar refuses token {t} it had accepted: the tree file does not match this build"
                    )));
                }
            }
            let spec = GrammarSpec {
                gbnf: g.gbnf.clone(),
                trigger_patterns: g.trigger_patterns.clone(),
                trigger_tokens: g.trigger_tokens.clone(),
            };
            Some((sampler, spec))
        }
    };
    let mut sampling = BranchSampling::new(chain, grammar);
    sampling.history = History {
        chain: saved.accepted.clone(),
        grammar: saved
            .grammar
            .as_ref()
            .map(|g| g.accepted.clone())
            .unwrap_or_default(),
    };
    Ok(sampling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeKv;
    use crate::engine::pool::Pool;
    use crate::engine::store::{CreateOptions, ForkOptions};
    use crate::llama::Token;

    use crate::engine::store_tests::{greedy, root, N_VOCAB};

    fn samplings(saved: &[SavedBranch]) -> Vec<BranchSampling> {
        saved
            .iter()
            .map(|b| restore_sampling(&b.sampling, None, N_VOCAB, 256).unwrap())
            .collect()
    }

    fn commit(kv: &mut FakeKv, store: &mut BranchStore, pool: &Pool, hs: &[Handle]) {
        let items: Vec<(Handle, Token)> = hs
            .iter()
            .map(|&h| (h, store.sample(h).unwrap().unwrap()))
            .collect();
        store.commit(kv, pool, &items, true, &|| false).unwrap();
    }

    /// root (5 prompt tokens) → a (+2) → a2 (+1); root → b (+3); root → c (no own cells).
    fn tree(kv: &mut FakeKv, store: &mut BranchStore) -> Vec<Handle> {
        let pool = Pool::new(1);
        let root = root(kv, store, &[1, 2, 3, 4, 5]);
        commit(kv, store, &pool, &[root]);
        let a = store.fork(kv, root, ForkOptions::default()).unwrap();
        let b = store.fork(kv, root, ForkOptions::default()).unwrap();
        let c = store.fork(kv, root, ForkOptions::default()).unwrap();
        commit(kv, store, &pool, &[a, b]);
        commit(kv, store, &pool, &[a, b]);
        commit(kv, store, &pool, &[b]);
        let a2 = store.fork(kv, a, ForkOptions::default()).unwrap();
        commit(kv, store, &pool, &[a2]);
        vec![root, a, a2, b, c]
    }

    #[test]
    fn a_tree_restores_with_its_prefixes_shared_and_its_state() {
        let (mut kv, mut store) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        let hs = tree(&mut kv, &mut store);
        let cells_before = kv.cells_used();
        let saved = store.save_tree(&kv, hs[0]).unwrap();
        assert_eq!(kv.cells_used(), cells_before, "saving changes no cells");
        assert_eq!(store.available(&kv), 3, "the scratch sequence is back");
        let positions: Vec<i32> = saved.iter().map(|b| b.position).collect();
        assert_eq!(positions, vec![6, 8, 9, 9, 6], "depth first, parents first");
        let shared: Vec<u32> = saved.iter().map(|b| b.shared).collect();
        assert_eq!(
            shared,
            vec![0, 6, 8, 6, 6],
            "each child stores cells past its parent's"
        );
        let own_cells: Vec<usize> = saved.iter().map(|b| (b.kv.len().max(8) - 8) / 4).collect();
        assert_eq!(own_cells, vec![6, 2, 1, 3, 0], "each prefix once");
        assert!(matches!(saved[4].logits, SavedLogits::SameAsParent));

        let (kv2, mut store2) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        store2
            .create(
                &kv2,
                CreateOptions {
                    position: 0,
                    seq: None,
                    sampling: greedy(),
                    n_batch: None,
                },
            )
            .unwrap();
        let restored = store2
            .restore_tree(&kv2, &saved, samplings(&saved))
            .unwrap();
        assert_eq!(kv2.cells_used(), cells_before, "shared again, not copied");
        assert_eq!(store2.kv_pressure(&kv2).cells_used, cells_before);
        for (i, (&h, &orig)) in restored.iter().zip(&hs).enumerate() {
            let (b, o) = (store2.get(h).unwrap(), store.get(orig).unwrap());
            assert_eq!(b.position, o.position, "branch {i}");
            assert_eq!(kv2.seq_pos_max(b.seq) + 1, b.position);
            assert_eq!(b.snapshot(), o.snapshot(), "branch {i} logits");
            assert_eq!(b.model_ppl.parts(), o.model_ppl.parts());
            assert_eq!(b.children.len(), o.children.len());
        }
        assert_eq!(store2.get(restored[2]).unwrap().parent, Some(restored[1]));
    }

    #[test]
    fn a_restore_that_cannot_finish_leaves_nothing_behind() {
        let (mut kv, mut store) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        let hs = tree(&mut kv, &mut store);
        let saved = store.save_tree(&kv, hs[0]).unwrap();

        let (kv2, mut store2) = (FakeKv::new(256, 4), BranchStore::new(4, false));
        let e = store2
            .restore_tree(&kv2, &saved, samplings(&saved))
            .unwrap_err();
        assert_eq!(e.code(), "ERR_NO_FREE_SEQUENCE");
        assert!(e.to_string().contains("needs 5"), "{e}");

        let (kv3, mut store3) = (FakeKv::new(11, 8), BranchStore::new(8, false));
        let e = store3
            .restore_tree(&kv3, &saved, samplings(&saved))
            .unwrap_err();
        assert_eq!(e.code(), "ERR_KV_FULL");

        // A branch whose cells llama.cpp refuses, after others were restored: all undone.
        let mut bad = saved.clone();
        bad[3].kv.truncate(10);
        let (kv4, mut store4) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        let e = store4
            .restore_tree(&kv4, &bad, samplings(&bad))
            .unwrap_err();
        assert_eq!(e.code(), "ERR_STATE");
        assert!(store4.is_empty());
        assert_eq!(kv4.cells_used(), 0);
        assert_eq!(store4.available(&kv4), 8);
    }

    #[test]
    fn without_a_spare_sequence_every_branch_is_saved_whole() {
        let (mut kv, mut store) = (FakeKv::new(256, 5), BranchStore::new(5, false));
        let hs = tree(&mut kv, &mut store);
        let saved = store.save_tree(&kv, hs[0]).unwrap();
        assert!(saved.iter().all(|b| b.shared == 0));
        let (kv2, mut store2) = (FakeKv::new(256, 5), BranchStore::new(5, false));
        let restored = store2
            .restore_tree(&kv2, &saved, samplings(&saved))
            .unwrap();
        for (&h, &orig) in restored.iter().zip(&hs) {
            assert_eq!(
                store2.get(h).unwrap().position,
                store.get(orig).unwrap().position
            );
        }
    }

    #[test]
    fn sliding_window_children_go_whole_when_the_parent_moved_past_their_window() {
        let (mut kv, mut store) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        kv.n_swa = 4;
        let hs = tree(&mut kv, &mut store);
        let saved = store.save_tree(&kv, hs[0]).unwrap();
        // a (8) forked root at 6 and root did not move: shared. a2 forked a at 8, a did not
        // move: shared. b and c likewise (the root stayed at 6).
        assert_eq!(
            saved.iter().map(|b| b.shared).collect::<Vec<_>>(),
            vec![0, 6, 8, 6, 6]
        );
        let pool = Pool::new(1);
        for _ in 0..5 {
            commit(&mut kv, &mut store, &pool, &[hs[0]]);
        }
        let saved = store.save_tree(&kv, hs[0]).unwrap();
        // The root is now at 11, past 4 + the fork point 6: b (9) still needs cells of its
        // window below 6, which the restored root no longer keeps.
        assert_eq!(saved[3].shared, 0);
        assert_eq!(saved[1].shared, 0);
    }

    #[test]
    fn shared_cells_are_the_common_run_prefix() {
        let r = |id, used| RunRef { id, used };
        assert_eq!(shared_cells(&[r(0, 5), r(1, 3)], &[r(0, 5), r(2, 4)]), 5);
        assert_eq!(shared_cells(&[r(0, 5)], &[r(0, 3), r(2, 4)]), 3);
        assert_eq!(shared_cells(&[r(0, 5), r(1, 3)], &[r(0, 5), r(1, 2)]), 7);
        assert_eq!(shared_cells(&[r(1, 5)], &[r(0, 5)]), 0);
    }

    /// An image source of 3 rows of width 4 per image.
    struct Images;

    impl crate::engine::media::ImageSource for Images {
        fn n_embd(&self) -> usize {
            4
        }
        fn encode(&mut self, _: usize) -> Result<Vec<f32>> {
            Ok(vec![0.25; 3 * 4])
        }
        fn non_causal(&self, _: usize) -> bool {
            true
        }
    }

    #[test]
    fn a_tree_with_an_image_restores_its_spans_and_forks_keep_behaving() {
        use crate::engine::media::{ImageSpan, MediaPiece};
        let id = "5e".repeat(32);
        let (mut kv, mut store) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        let pool = Pool::new(1);
        let root = root(&mut kv, &mut store, &[1, 2]);
        let pieces = [
            MediaPiece::Text(&[3]),
            MediaPiece::Image {
                n_tokens: 3,
                n_pos: 3,
                id: &id,
            },
            MediaPiece::Text(&[4]),
        ];
        store
            .prefill_media(&mut kv, root, &pieces, None, &mut Images, &|| false)
            .unwrap();
        let image = ImageSpan {
            start: 3,
            n_pos: 3,
            id: id.as_str().into(),
        };
        assert_eq!(store.get(root).unwrap().images, vec![image.clone()]);
        let after = store.fork(&kv, root, ForkOptions::default()).unwrap();
        commit(&mut kv, &mut store, &pool, &[after]);
        let before = store
            .fork(
                &kv,
                root,
                ForkOptions {
                    position: Some(3),
                    ..ForkOptions::default()
                },
            )
            .unwrap();
        store
            .prefill(&mut kv, &[(before, vec![7, 8])], None, &|| false)
            .unwrap();
        let saved = store.save_tree(&kv, root).unwrap();
        let spans: Vec<_> = saved.iter().map(|b| b.images.clone()).collect();
        assert_eq!(
            spans,
            vec![vec![image.clone()], vec![image.clone()], vec![]]
        );

        let (kv2, mut store2) = (FakeKv::new(256, 8), BranchStore::new(8, false));
        let restored = store2
            .restore_tree(&kv2, &saved, samplings(&saved))
            .unwrap();
        assert_eq!(kv2.cells_used(), kv.cells_used(), "the image's cells once");
        for (&h, &orig) in restored.iter().zip(&[root, after, before]) {
            let (b, o) = (store2.get(h).unwrap(), store.get(orig).unwrap());
            assert_eq!((b.position, &b.images), (o.position, &o.images));
        }
        let at = |p| ForkOptions {
            position: Some(p),
            ..ForkOptions::default()
        };
        for inside in [4, 5] {
            let e = store2.fork(&kv2, restored[0], at(inside)).unwrap_err();
            assert_eq!(e.code(), "ERR_IMAGE_POSITIONS", "{e}");
        }
        let past = store2.fork(&kv2, restored[1], at(6)).unwrap();
        assert_eq!(store2.get(past).unwrap().images, vec![image]);
        let below = store2.fork(&kv2, restored[0], at(3)).unwrap();
        assert_eq!(store2.get(below).unwrap().images, vec![]);
    }
}
