//! Recurrent state bookkeeping of hybrid (linear-attention) models, beside the block pool: which
//! state group each running sequence holds and the row its next step starts from, and the saved
//! states that let a later request reuse a prefix, least recently used out first.
//!
//! The scheduler owns the groups (admission waits for a free one; finishing or preemption frees
//! it, and a preempted sequence recomputes its state with its KV); this follows them. The engine
//! copies states in and out of the model on this module's word: [`RecurrentStates::rows`] says
//! when to restore a saved state, [`RecurrentStates::save`] where to save one and which saved
//! prefix stops being reusable.
use crate::RequestId;
use smart_default::SmartDefault;
use std::collections::{HashMap, VecDeque};

/// Which state rows a sequence uses in a step (recurrent models only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, SmartDefault)]
pub struct StateSlots {
    /// The sequence's group of rows (one group per running sequence).
    pub group: u32,
    /// Row of the group to start from: the state `from` tokens back from the end of the previous
    /// step (0 after a plain step; drafts rejected in a verify step move it back). Ignored at
    /// position 0, which starts from the zero state.
    pub from: u32,
    /// States to keep from this step: the last `keep` (clamped to the step's tokens).
    #[default(1)]
    pub keep: u32,
}

/// What to do to save the state at the end of a prefix ([`RecurrentStates::save`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// A state of that prefix is saved already (now the most recently used).
    Kept,
    /// Copy the state into saved slot `slot`, then report with [`RecurrentStates::saved`]; the
    /// prefix `evicted` (if any) lost its saved state to make room and must no longer be reused.
    Into {
        /// The saved slot.
        slot: u32,
        /// The prefix whose state the slot held.
        evicted: Option<u64>,
    },
    /// No slot to save into (none configured).
    Nowhere,
}

/// Recurrent states of running sequences, and saved ones by prefix.
#[derive(Debug, Clone)]
pub struct RecurrentStates {
    /// Each sequence holding state: (group, row its next step starts from).
    held: HashMap<RequestId, (u32, u32)>,
    /// Saved slot of each saved prefix hash.
    saved: HashMap<u64, u32>,
    /// Saved prefix hashes, least recently used first.
    lru: VecDeque<u64>,
    free: Vec<u32>,
}

impl RecurrentStates {
    /// Bookkeeping with `saved_slots` slots for saved states.
    pub fn new(saved_slots: u32) -> RecurrentStates {
        RecurrentStates {
            held: HashMap::new(),
            saved: HashMap::new(),
            lru: VecDeque::new(),
            free: (0..saved_slots).rev().collect(),
        }
    }

    /// Sequence `id` no longer holds state (finished, cancelled or preempted).
    pub fn release(&mut self, id: RequestId) {
        self.held.remove(&id);
    }

    /// Marks saved prefix `hash` as just used.
    fn touch(&mut self, hash: u64) {
        self.lru.retain(|&h| h != hash);
        self.lru.push_back(hash);
    }

    /// The rows of planned sequence `id` in its group `group`, keeping `keep` rows, and the saved
    /// slot to restore into the group before the step, if any. A sequence starts over when it
    /// starts at position 0 or in another group; past a reused prefix (`start_pos > 0`), the
    /// prefix's saved state is restored (`prefix` gives its hash, asked only then).
    pub fn rows(
        &mut self,
        id: RequestId,
        group: Option<u32>,
        start_pos: u32,
        keep: u32,
        prefix: impl FnOnce() -> Option<u64>,
    ) -> Result<(StateSlots, Option<u32>), String> {
        let group =
            group.ok_or("the scheduler planned a recurrent sequence without a state slot")?;
        let mut restore = None;
        if start_pos == 0 || self.held.get(&id).map(|h| h.0) != Some(group) {
            self.release(id);
            if start_pos > 0 {
                let hash = prefix();
                let slot = hash
                    .and_then(|h| self.saved.get(&h).copied())
                    .ok_or("a reused prefix without a saved recurrent state")?;
                if let Some(h) = hash {
                    self.touch(h);
                }
                restore = Some(slot);
            }
            self.held.insert(id, (group, 0));
        }
        let &(group, from) = self.held.get(&id).ok_or("no recurrent state group")?;
        Ok((StateSlots { group, from, keep }, restore))
    }

    /// After a verify step of `drafts` drafts of which `accepted` were accepted: sequence `id`'s
    /// next step starts `drafts - accepted` rows back.
    pub fn verified(&mut self, id: RequestId, drafts: usize, accepted: usize) {
        if let Some(h) = self.held.get_mut(&id) {
            h.1 = (drafts - accepted.min(drafts)) as u32;
        }
    }

    /// The group sequence `id` holds, if any.
    pub fn group(&self, id: RequestId) -> Option<u32> {
        self.held.get(&id).map(|h| h.0)
    }

    /// Where to save the state at the end of prefix `hash`: nowhere new if it is saved already,
    /// else a free slot, else the least recently used saved prefix's slot.
    pub fn save(&mut self, hash: u64) -> Save {
        if self.saved.contains_key(&hash) {
            self.touch(hash);
            return Save::Kept;
        }
        if let Some(slot) = self.free.pop() {
            return Save::Into {
                slot,
                evicted: None,
            };
        }
        while let Some(old) = self.lru.pop_front() {
            if let Some(slot) = self.saved.remove(&old) {
                return Save::Into {
                    slot,
                    evicted: Some(old),
                };
            }
        }
        Save::Nowhere
    }

    /// The copy [`RecurrentStates::save`] asked for into `slot` ended: prefix `hash` is saved
    /// there when it `worked`, else the slot is free again.
    pub fn saved(&mut self, hash: u64, slot: u32, worked: bool) {
        if worked {
            self.saved.insert(hash, slot);
            self.touch(hash);
        } else {
            self.free.push(slot);
        }
    }

    /// The saved slot of prefix `hash`, if saved.
    pub fn saved_slot(&self, hash: u64) -> Option<u32> {
        self.saved.get(&hash).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_sequence_starts_over_at_position_0_and_restores_past_a_reused_prefix() {
        let mut s = RecurrentStates::new(2);
        let (rows, restore) = s.rows(1, Some(3), 0, 1, || None).unwrap();
        assert_eq!((rows.group, rows.from, restore), (3, 0, None));
        s.verified(1, 4, 1);
        assert_eq!(s.rows(1, Some(3), 20, 5, || None).unwrap().0.from, 3);
        assert!(
            s.rows(2, Some(4), 32, 1, || Some(9)).is_err(),
            "nothing saved"
        );
        assert_eq!(
            s.save(9),
            Save::Into {
                slot: 0,
                evicted: None
            }
        );
        s.saved(9, 0, true);
        assert_eq!(s.save(9), Save::Kept);
        let (rows, restore) = s.rows(2, Some(4), 32, 1, || Some(9)).unwrap();
        assert_eq!((rows.group, rows.from, restore), (4, 0, Some(0)));
        assert!(s.rows(5, None, 0, 1, || None).is_err());
    }

    /// One operation on the saved states: save prefix h (the copy works or not), or reuse it.
    #[derive(Debug, Clone)]
    enum Op {
        Save(u64, bool),
        Reuse(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..8, any::<bool>()).prop_map(|(h, ok)| Op::Save(h, ok)),
            (0u64..8).prop_map(Op::Reuse),
        ]
    }

    proptest! {
        /// Against a model of an LRU cache: at most `slots` prefixes are saved, each in a slot of
        /// its own; a save into a full cache evicts the least recently used prefix (saved or
        /// reused), and only that one.
        #[test]
        fn saved_states_follow_least_recently_used(slots in 0u32..4, ops in prop::collection::vec(op(), 0..60)) {
            let mut s = RecurrentStates::new(slots);
            let mut model: Vec<u64> = Vec::new(); // least recently used first
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Save(h, worked) => match s.save(h) {
                        Save::Kept => {
                            prop_assert!(model.contains(&h));
                            model.retain(|&x| x != h);
                            model.push(h);
                        }
                        Save::Nowhere => prop_assert_eq!(slots, 0),
                        Save::Into { slot, evicted } => {
                            prop_assert!(slot < slots && !model.contains(&h));
                            if model.len() == slots as usize {
                                prop_assert_eq!(evicted, Some(model.remove(0)));
                            } else {
                                prop_assert_eq!(evicted, None);
                            }
                            s.saved(h, slot, worked);
                            if worked {
                                model.push(h);
                            }
                        }
                    },
                    Op::Reuse(h) => {
                        let reused = s.rows(i as u64, Some(0), 16, 1, || Some(h));
                        prop_assert_eq!(reused.is_ok(), model.contains(&h));
                        if reused.is_ok() {
                            model.retain(|&x| x != h);
                            model.push(h);
                        }
                    }
                }
                let mut taken: Vec<u32> = model.iter().filter_map(|&h| s.saved_slot(h)).collect();
                prop_assert_eq!(taken.len(), model.len());
                taken.sort_unstable();
                taken.dedup();
                prop_assert_eq!(taken.len(), model.len(), "two prefixes share a slot");
            }
        }
    }
}
