//! Generation-counted handle table. A handle is `(generation << 16) | slot`; slot 0 is reserved so
//! that handle 0 is never valid. Freeing a slot bumps its generation, so a stale handle (one that
//! outlived its branch) is detected instead of silently addressing the slot's next tenant.

const GEN_SHIFT: u32 = 16;
const INDEX_MASK: u32 = 0xFFFF;
/// Slots 1..=65535 are usable; slot 0 is the reserved "invalid" slot.
pub const MAX_SLOTS: usize = (INDEX_MASK as usize) + 1;

pub type Handle = u32;
pub const INVALID_HANDLE: Handle = 0;

pub fn make_handle(index: u32, generation: u16) -> Handle {
    ((generation as u32) << GEN_SHIFT) | (index & INDEX_MASK)
}

pub fn handle_index(h: Handle) -> usize {
    (h & INDEX_MASK) as usize
}

pub fn handle_generation(h: Handle) -> u16 {
    (h >> GEN_SHIFT) as u16
}

struct Slot<T> {
    generation: u16,
    value: Option<T>,
}

pub struct HandleTable<T> {
    slots: Vec<Slot<T>>,
    /// LIFO stack of free slot indices (the most recently freed slot is reused first).
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        Self::with_capacity(16)
    }
}

impl<T> HandleTable<T> {
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.clamp(2, MAX_SLOTS);
        let mut table = HandleTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        };
        table.grow_to(capacity);
        table
    }

    fn grow_to(&mut self, new_len: usize) {
        let old_len = self.slots.len();
        for _ in old_len..new_len {
            self.slots.push(Slot {
                generation: 0,
                value: None,
            });
        }
        // Push in reverse so the lowest new index is popped first; slot 0 is never free.
        for index in (old_len.max(1)..new_len).rev() {
            self.free.push(index as u32);
        }
    }

    /// Stores `value` and returns its handle, or `None` when all 65535 slots are live.
    pub fn insert(&mut self, value: T) -> Option<Handle> {
        if self.free.is_empty() {
            let len = self.slots.len();
            if len >= MAX_SLOTS {
                return None;
            }
            self.grow_to((len * 2).min(MAX_SLOTS));
        }
        let index = self.free.pop()?;
        let slot = &mut self.slots[index as usize];
        slot.value = Some(value);
        self.live += 1;
        Some(make_handle(index, slot.generation))
    }

    fn slot_of(&self, h: Handle) -> Option<usize> {
        let index = handle_index(h);
        if index == 0 || index >= self.slots.len() {
            return None;
        }
        let slot = &self.slots[index];
        (slot.value.is_some() && slot.generation == handle_generation(h)).then_some(index)
    }

    pub fn contains(&self, h: Handle) -> bool {
        self.slot_of(h).is_some()
    }

    pub fn get(&self, h: Handle) -> Option<&T> {
        self.slot_of(h).and_then(|i| self.slots[i].value.as_ref())
    }

    pub fn get_mut(&mut self, h: Handle) -> Option<&mut T> {
        let i = self.slot_of(h)?;
        self.slots[i].value.as_mut()
    }

    /// Removes and returns the value; the slot's generation advances (wrapping) so `h` goes stale.
    pub fn remove(&mut self, h: Handle) -> Option<T> {
        let i = self.slot_of(h)?;
        let slot = &mut self.slots[i];
        let value = slot.value.take();
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(i as u32);
        self.live -= 1;
        value
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Handles of every live entry, in slot order.
    pub fn handles(&self) -> Vec<Handle> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.value.is_some())
            .map(|(i, s)| make_handle(i as u32, s.generation))
            .collect()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }

    /// Mutable access to several entries at once (for per-branch work on several threads), in
    /// the order of `hs`; `None` if any handle is stale or appears twice.
    pub fn get_many_mut(&mut self, hs: &[Handle]) -> Option<Vec<&mut T>> {
        let indices: Vec<usize> = hs.iter().map(|&h| self.slot_of(h)).collect::<Option<_>>()?;
        let mut by_slot: Vec<Option<&mut T>> =
            self.slots.iter_mut().map(|s| s.value.as_mut()).collect();
        indices.iter().map(|&i| by_slot[i].take()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_encoding_round_trips() {
        let h = make_handle(0xFFFF, 0xFFFF);
        assert_eq!(handle_index(h), 0xFFFF);
        assert_eq!(handle_generation(h), 0xFFFF);
        assert_eq!(make_handle(0, 0), INVALID_HANDLE);
    }

    #[test]
    fn first_handles_start_at_slot_one_and_zero_is_never_valid() {
        let mut t = HandleTable::with_capacity(4);
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!(handle_index(a), 1);
        assert_eq!(handle_index(b), 2);
        assert!(t.get(INVALID_HANDLE).is_none());
        for generation in [0u16, 1, 0xFFFF] {
            assert!(t.get(make_handle(0, generation)).is_none());
        }
    }

    #[test]
    fn stale_handle_is_rejected_after_reuse() {
        let mut t = HandleTable::with_capacity(2);
        let a = t.insert(1).unwrap();
        assert_eq!(t.remove(a), Some(1));
        assert!(t.get(a).is_none());
        assert_eq!(t.remove(a), None, "double remove is a no-op");
        let b = t.insert(2).unwrap();
        assert_eq!(
            handle_index(a),
            handle_index(b),
            "LIFO reuse of the freed slot"
        );
        assert_eq!(handle_generation(b), handle_generation(a) + 1);
        assert!(t.get(a).is_none());
        assert_eq!(t.get(b), Some(&2));
    }

    #[test]
    fn out_of_range_and_foreign_generation_handles_are_rejected() {
        let mut t = HandleTable::with_capacity(2);
        let a = t.insert(7).unwrap();
        assert!(t.get(make_handle(500, 0)).is_none());
        assert!(t.get(make_handle(handle_index(a) as u32, 3)).is_none());
    }

    #[test]
    fn grows_by_doubling_and_stops_at_65535_live() {
        let mut t = HandleTable::with_capacity(2);
        let mut handles = Vec::new();
        for i in 0..(MAX_SLOTS - 1) {
            handles.push(t.insert(i).unwrap());
        }
        assert_eq!(t.capacity(), MAX_SLOTS);
        assert!(t.insert(0).is_none(), "65536th live entry must be refused");
        t.remove(handles[10]);
        assert!(t.insert(1).is_some());
        assert_eq!(t.len(), MAX_SLOTS - 1);
    }

    #[test]
    fn generation_wraps_without_reviving_old_handles() {
        let mut t = HandleTable::with_capacity(2);
        let first = t.insert(0).unwrap();
        t.remove(first);
        let mut last = first;
        for _ in 0..0xFFFF {
            last = t.insert(0).unwrap();
            t.remove(last);
        }
        assert_eq!(handle_generation(last), 0xFFFF);
        let wrapped = t.insert(0).unwrap();
        assert_eq!(handle_generation(wrapped), 0);
        assert!(t.get(last).is_none());
        assert!(t.get(wrapped).is_some());
    }

    #[test]
    fn get_many_mut_refuses_duplicates_and_stale_handles() {
        let mut t = HandleTable::with_capacity(4);
        let a = t.insert(1).unwrap();
        let b = t.insert(2).unwrap();
        for v in t.get_many_mut(&[b, a]).unwrap() {
            *v *= 10;
        }
        assert_eq!((t.get(a), t.get(b)), (Some(&10), Some(&20)));
        assert!(t.get_many_mut(&[a, a]).is_none());
        t.remove(b);
        assert!(t.get_many_mut(&[a, b]).is_none());
    }

    #[test]
    fn handles_lists_live_entries() {
        let mut t = HandleTable::with_capacity(4);
        let a = t.insert('a').unwrap();
        let b = t.insert('b').unwrap();
        let c = t.insert('c').unwrap();
        t.remove(b);
        assert_eq!(t.handles(), vec![a, c]);
        assert_eq!(t.len(), 2);
    }
}
