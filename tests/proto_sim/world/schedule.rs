//! The seeded schedule: requests started at random points, writer, staging, delivery and
//! reader steps chosen among what can move, time and deadlines, resets; and the checks once
//! the world is quiet.

use std::collections::VecDeque;

use morio::proto::frame::Op;
use morio::proto::plan::Piece;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{Sim, Spec, LOCAL_BYTES, MAX_STEPS, TARGET_BYTES};
use crate::net::Cause;

/// One step of the schedule.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A lane's writer sends (part of) its next frame.
    Write(usize),
    /// A lane's pending staging copy fails.
    Staging(usize),
    /// Deliver bytes to the target on a connection.
    Up(usize),
    /// Deliver bytes to the initiator on a connection.
    Down(usize),
}

impl Sim {
    /// Run until nothing can move and every request has started; requests start at random
    /// points (or all at once when `!stagger`).
    pub fn run(&mut self, specs: Vec<Spec>, stagger: bool) {
        self.run_until(specs, stagger, |_| false);
    }

    /// [`Sim::run`], stopping early once `stop` holds; the requests not yet started.
    pub fn run_until(
        &mut self,
        specs: Vec<Spec>,
        stagger: bool,
        stop: impl Fn(&Sim) -> bool,
    ) -> Vec<Spec> {
        let seed = self.seed;
        let mut queued: VecDeque<Spec> = specs.into();
        if !stagger {
            while let Some(s) = queued.pop_front() {
                self.submit(s);
            }
        }
        loop {
            if stop(self) {
                return queued.into();
            }
            self.steps += 1;
            assert!(self.steps < MAX_STEPS, "seed {seed}: no quiescence");
            if !queued.is_empty() && self.rng.gen_ratio(1, 16) {
                let s = queued.pop_front().expect("queued");
                self.submit(s);
                continue;
            }
            let active = self.active(queued.is_empty());
            let Some(&step) = active.choose(&mut self.rng) else {
                match queued.pop_front() {
                    Some(s) => {
                        self.submit(s);
                        continue;
                    }
                    None => return Vec::new(),
                }
            };
            self.step(step);
            self.now += 1;
            self.joins.now.set(self.now);
            self.tick();
        }
    }

    /// Everything that can move now.
    fn active(&self, nothing_queued: bool) -> Vec<Step> {
        let mut v = Vec::new();
        let i = self.cur();
        if !self.inits[i].crashed {
            for (l, lane) in self.inits[i].lanes.iter().enumerate() {
                if lane.book.dead() || !lane.ready {
                    continue;
                }
                let conn = &self.conns[lane.conn];
                let room = !conn.target_open || conn.up.in_flight() < self.sndbuf;
                if lane.staging.is_some() {
                    v.push(Step::Staging(l));
                } else if room && (lane.out.is_some() || lane.book.queued() > 0) {
                    v.push(Step::Write(l));
                }
            }
        }
        for (c, conn) in self.conns.iter().enumerate() {
            if conn.stalled {
                continue;
            }
            // A connection's weight makes some lanes faster than others.
            if conn.target_open && (conn.up.in_flight() > 0 || !conn.init_open) {
                v.extend(std::iter::repeat_n(Step::Up(c), conn.weight));
            }
            let down = conn.init_open && (conn.down.in_flight() > 0 || !conn.target_open);
            if down && !conn.lagging {
                v.extend(std::iter::repeat_n(Step::Down(c), conn.weight));
            }
        }
        if v.is_empty() && nothing_queued {
            for (c, conn) in self.conns.iter().enumerate() {
                let down = conn.init_open && (conn.down.in_flight() > 0 || !conn.target_open);
                if conn.lagging && !conn.stalled && down {
                    v.push(Step::Down(c));
                }
            }
        }
        v
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Write(l) => self.write_step(l),
            Step::Staging(l) => self.staging_fails(l),
            Step::Up(c) => {
                let n = self.rng.gen_range(1..=self.burst);
                self.conns[c].up.deliver(n);
                self.pump_up(c);
            }
            Step::Down(c) => {
                let n = self.rng.gen_range(1..=self.burst);
                self.conns[c].down.deliver(n);
                self.pump_down(c);
            }
        }
        self.drain_reports();
    }

    /// Let time pass to `now` and fail what is due.
    pub fn advance(&mut self, now: u64) {
        self.now = now;
        self.joins.now.set(now);
        self.tick();
    }

    /// Connection `c` is reset under both ends.
    pub fn reset(&mut self, c: usize) {
        let conn = &self.conns[c];
        assert_eq!(conn.inst, self.cur());
        let l = conn.lane;
        if conn.init_open {
            self.die(l, Cause::Reset);
            self.drain_reports();
        }
    }

    /// Whether lane `l` of the running initiator is ready (its handshake done, alive).
    pub fn lane_ready(&self, l: u16) -> bool {
        let lane = &self.inits[self.cur()].lanes[l as usize];
        lane.ready && !lane.book.dead()
    }

    /// Check that nothing is left to do: live lanes are drained and wait for no frame's own
    /// answer, live connections carry nothing.
    pub fn check_quiet(&self) {
        let seed = self.seed;
        let i = self.cur();
        if !self.inits[i].crashed {
            for (l, lane) in self.inits[i].lanes.iter().enumerate() {
                if lane.book.dead() {
                    continue;
                }
                assert!(
                    lane.out.is_none() && lane.staging.is_none() && lane.book.queued() == 0,
                    "seed {seed}: lane {l} has work left"
                );
                // Every chunk's own answer and every FINISH's COMPLETE came; what chunks of
                // several are kept for belongs to transfers that have ended.
                assert_eq!(
                    lane.book.waiting(),
                    0,
                    "seed {seed}: lane {l} still waits for answers"
                );
            }
        }
        for (c, conn) in self.conns.iter().enumerate() {
            if conn.init_open && conn.target_open && !conn.stalled {
                assert!(
                    conn.up.idle() && conn.down.idle(),
                    "seed {seed}: connection {c} not drained"
                );
            }
        }
    }

    /// Bytes a piece of transfer `x` lands on, clamped to the region: (region is local, off,
    /// len).
    pub fn destination(&self, x: usize, p: &Piece) -> (bool, usize, usize) {
        let (local, off) = match self.xfers[x].spec.op {
            Op::Write => (false, p.remote),
            Op::Read => (true, p.local),
        };
        let size = if local { LOCAL_BYTES } else { TARGET_BYTES };
        let lo = off.min(size);
        let hi = (off + p.len).min(size);
        (local, lo as usize, (hi - lo) as usize)
    }
}
