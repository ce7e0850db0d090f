//! Graph code of recurrent layers' state: reading a sequence's starting state from its pool and
//! writing its kept states back ([`crate::recurrent`] holds the pools and the step's rows).
use super::Step;
use crate::recurrent::{StateSeq, StateStep};
use axle_ggml::{StoredTensor, Tensor};

impl<'a> Step<'a> {
    /// The recurrent part of the step. Panics for a model without recurrent layers (a family
    /// calls this only from its recurrent layers, which the runner gives a state step).
    fn state_step(&self) -> &StateStep<'a> {
        match &self.state {
            Some(s) => s,
            None => panic!("a recurrent layer in a step without recurrent state"),
        }
    }

    /// The step's sequences, for the recurrent layers.
    pub fn state_seqs(&self) -> Vec<StateSeq> {
        self.state_step().seqs.clone()
    }

    /// Sequence `i`'s starting state of pool `pool` (a row [width, 1]).
    pub fn state_read(&self, pool: &'a StoredTensor, i: usize) -> Tensor<'a> {
        let st = self.state_step();
        let g = self.ctx;
        let nb = st.read.nb();
        let idx = g.view(st.read, &[1], &[], i * nb[0]);
        g.get_rows(pool.t(), idx)
    }

    /// Writes sequence `i`'s kept states (`rows` [width, keep], most recent first) into pool
    /// `pool`.
    pub fn state_write(&mut self, pool: &'a StoredTensor, i: usize, rows: Tensor<'a>) {
        let g = self.ctx;
        let (seq, write) = {
            let st = self.state_step();
            (st.seqs[i], st.write)
        };
        let nb = write.nb();
        let idx = g.view(write, &[seq.keep], &[], seq.write_off as usize * nb[0]);
        let written = g.set_rows(pool.t(), rows, idx);
        self.graph.expand(written);
    }
}
