//! Deterministic two-endpoint simulation of the morio wire protocol (version 5) that drives
//! the real state machines of `morio::proto` with no sockets: an initiator and a target
//! exchange frames built and parsed only with `morio::proto` over in-memory connections,
//! under seeded schedules that reorder traffic across lanes and cut frames (and the
//! initiator's writes) at arbitrary byte points. Checks final statuses, data placement,
//! inbound bookkeeping, refusals, lost lanes (corrupt streams, resets, a transfer that ends
//! mid-frame), deadlines with late answers, chunks that fail on the initiator, and a
//! restarted initiator.
//!
//! The simulator owns no protocol logic. The initiator is owner shards, each a table of
//! `outbound::Outbound`s that cuts transfers with `dispatch::dispatch` onto the lane
//! `dispatch::home_lane` picks, plus one `lane::LaneBook` per lane whose frames a simulated
//! writer pops, registers (`sending_write` / `sending_read` / `sending_finish`, `sent`,
//! `unsend` on a failed GPU staging copy) and puts on the wire; a simulated reader feeds
//! answers to `LaneBook::answer` and `read_done`, and the owner feeds the reports to
//! `Outbound::on_report`, sends FINISH when asked, `cancel`s a transfer that ended early on
//! its lanes (a lane whose WRITE of it is half sent dies), and times transfers out. Lanes
//! `die` with their connection and are dialed again (HELLO, `handshake::check_ack`) when
//! work comes for them. The target is one `target::Served` per connection (accepted with
//! `handshake::check_hello`) and one `join::JoinMap` behind a `JoinTable` adapter: frames go
//! through `classify` and `Served::check`, a WRITE's payload is placed, then `write_done`;
//! a READ is answered with `read_reply`, then `read_done`; FINISH with `finish`; each
//! response's inbound status is recorded before its answer leaves. The simulator owns only
//! that adapter, the byte pipes, the memory on both sides, the scheduler, and the checks.
//!
//! The protocol it exercises: a multi-chunk transfer is joined on the target in one
//! engine-wide table, keyed by the initiator's key, instance and uid. Chunk 0 rides the
//! home lane, which every chunk names as its `join_lane`; the report that completes the
//! join, whichever chunk and lane it comes from, is answered for the whole transfer: the
//! target records the inbound status, then sends COMPLETE on that chunk's lane with its tag
//! (for a read, after that chunk's READ_DATA). The initiator keeps every chunk of a
//! multi-chunk transfer by tag on its lane once nothing else answers it, so whichever gets
//! the COMPLETE ends the transfer, and losing a lane fails every running transfer it holds
//! work of. A write ends with that COMPLETE, a read with it and every chunk's data, in either
//! order. FINISH is only an abort: sent on the home lane when a chunk fails on the initiator
//! before it left, it records the inbound status, ends the target's join, and its COMPLETE
//! ends the transfer. On even seeds the initiator fences as protocol version 11 has it: a
//! write of several chunks that failed early (a chunk that never left, a lost lane) leaves
//! its owner's table, each live lane that carried chunks of it (and its home lane) sends
//! FINISH after them (`LaneBook::fence`), and its status is set once each is answered or
//! its lane died, or at its deadline (or `FINISH_WAIT` steps) with those lanes reset.
//!
//! Set `PROTO_SIM_SEED=<n>` to run only seed `n` in every scenario, `MORIO_SOAK=<k>` for k times
//! the seeds (a long run by hand; the property tests take it too).

mod check;
mod gen;
mod net;
mod world;

use std::collections::BTreeSet;

use morio::proto::codes::{ERR_INVALID_ARGS, ERR_NOT_FOUND, SUCCESS};
use morio::proto::decode::DecodeError;
use morio::proto::frame::{Chunk, Frame, Hello, Op, Reply, Seg};
use morio::proto::layout::Layout;
use morio::proto::limits::{FRAME_MAGIC, HEADER_BYTES, MAX_LANES, VERSION};
use morio::proto::plan::Piece;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use check::Ended;
use gen::shift;
use morio::proto::access::AccessKey;
use net::Cause;
use world::{
    all_seeds, seeds, Sim, Spec, Want, ACCESS_KEY, LOCAL_ONLY_MEM_ID, TARGET_BYTES, TIMEOUT,
    UNKNOWN_MEM_ID,
};

/// Several concurrent reads and writes over every lane configuration, started at random
/// points: all succeed, nothing is lost, late or left behind.
fn scenario_success(seed: u64) -> Sim {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let n_lanes = rng.gen_range(1..=4);
    let n_shards = rng.gen_range(1..=3);
    let n_x = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes, n_shards);
    let specs = sim.gen_specs(n_x, Want::Success);
    sim.run(specs, true);
    let (ended, left) = sim.verify();
    assert!(ended.iter().all(|e| *e == Ended::AsWanted), "seed {seed}");
    assert!(sim.closes.is_empty(), "seed {seed}: {:?}", sim.closes);
    assert_eq!(
        (sim.stale, sim.late_reports),
        (0, 0),
        "seed {seed}: late answers"
    );
    // No FINISH without a local failure; every multi-chunk transfer answered by its join.
    if !sim.fences {
        assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    }
    let multi = sim.xfers.iter().filter(|x| x.multi()).count();
    assert_eq!(sim.answered.len(), multi, "seed {seed}: joins answered");
    assert_eq!(left, 0, "seed {seed}: joins left behind");
    sim
}

#[test]
fn sim_concurrent_transfers_succeed() {
    let (mut chunks, mut multi, mut single, mut strided, mut shared) = (0u64, 0, 0, 0, 0);
    let (mut off_home, mut by_data, mut by_complete) = (0, 0, 0);
    for seed in seeds(200) {
        let sim = scenario_success(seed);
        for x in &sim.xfers {
            chunks += u64::from(x.n_chunks);
            if x.multi() {
                multi += 1;
            } else {
                single += 1;
            }
            strided += usize::from(matches!(x.spec.layout, Layout::Strided(_)));
            shared += usize::from(x.shared_stripes);
        }
        off_home += sim.joins_off_home();
        by_data += sim.reads_ended_by_data;
        by_complete += sim.reads_ended_by_complete;
    }
    if all_seeds() {
        // The generator and the dispatch really exercise every path.
        eprintln!(
            "{single} single-chunk and {multi} multi-chunk transfers ({strided} strided, \
             {shared} sharing stripes), {chunks} chunks; {off_home} joins answered off the \
             home lane; reads ended by data {by_data} / by COMPLETE {by_complete}"
        );
        assert!(
            single > 100 && multi > 300,
            "single {single}, multi {multi}"
        );
        assert!(chunks > 8_000, "{chunks} chunks");
        assert!(
            strided > 100 && shared > 20,
            "strided {strided}, shared {shared}"
        );
        assert!(off_home > 60, "{off_home} joins answered off the home lane");
        assert!(
            by_data > 6 && by_complete > 100,
            "reads ended by data {by_data}, by COMPLETE {by_complete}"
        );
    }
}

#[test]
fn sim_is_deterministic() {
    for seed in seeds(5) {
        let a = scenario_success(seed).digest();
        let b = scenario_success(seed).digest();
        assert!(a == b, "seed {seed}: two runs differ");
    }
}

/// A key that is not the target region's: the zero key (a descriptor of MORI's form), the
/// region's key with one bit flipped, or a random one.
fn wrong_key(rng: &mut StdRng) -> AccessKey {
    match rng.gen_range(0..3) {
        0 => AccessKey::NONE,
        1 => {
            let mut b = ACCESS_KEY.to_bytes();
            b[rng.gen_range(0..16)] ^= 1 << rng.gen_range(0..8);
            AccessKey::from_bytes(b)
        }
        _ => {
            let k = AccessKey::from_bytes(rng.gen());
            assert!(k != ACCESS_KEY && !k.is_none());
            k
        }
    }
}

/// Good transfers next to one whose range reaches past the target region, one naming an
/// unknown region, one naming the region with a wrong access key, one naming a local-only
/// region (with its key, a wrong one or none), and (with several lanes) a striped write whose
/// destinations overlap: the first four fail with the target's code and move no byte (the
/// target's join answers a refused multi-chunk transfer like any other, no FINISH), and the
/// last three are refused with one code and message, so a peer cannot tell them apart; the
/// overlapping write is refused by the owner's dispatch and never leaves.
fn scenario_refusals(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xbad);
    let n_lanes = rng.gen_range(1..=4);
    let n_good = rng.gen_range(0..=3);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let windows = sim.windows(n_good + 5);
    let mut specs = Vec::new();
    for &w in &windows[..n_good] {
        specs.push(sim.gen_spec(w, Want::Success));
    }
    // Out of range: bypass normalisation with a piece crossing the region's end, its local
    // side and its remote start kept clear of the transfer's own pieces.
    let (lb, ll, rb, rl) = windows[n_good];
    let mut bad = sim.gen_spec((lb, ll - 32, rb, rl - 16), Want::Refused(ERR_INVALID_ARGS));
    let a = rng.gen_range(1..=16u64);
    let piece = Piece {
        local: lb + ll - 32,
        remote: TARGET_BYTES - a,
        len: rng.gen_range(a + 1..=32),
    };
    let mut pieces = bad.layout.clone().into_pieces();
    pieces.insert(rng.gen_range(0..=pieces.len()), piece);
    bad.layout = Layout::List(pieces);
    assert!(bad.layout.remote_extent().1 > TARGET_BYTES);
    assert!(!bad.layout.destination_overlaps(bad.op == Op::Write));
    specs.push(bad);
    let mut unknown = sim.gen_spec(windows[n_good + 1], Want::Refused(ERR_NOT_FOUND));
    unknown.mem_id = UNKNOWN_MEM_ID;
    specs.push(unknown);
    // The right region with a wrong key: refused before its ranges are looked at (some of
    // these reach past the region, which with the right key would be ERR_INVALID_ARGS).
    let mut keyless = sim.gen_spec(windows[n_good + 3], Want::Refused(ERR_NOT_FOUND));
    keyless.access_key = wrong_key(&mut rng);
    specs.push(keyless);
    let mut local_only = sim.gen_spec(windows[n_good + 4], Want::Refused(ERR_NOT_FOUND));
    local_only.mem_id = LOCAL_ONLY_MEM_ID;
    local_only.access_key = match rng.gen_range(0..3) {
        0 => ACCESS_KEY,
        _ => wrong_key(&mut rng),
    };
    specs.push(local_only);
    if n_lanes > 1 {
        let (lb, _, rb, _) = windows[n_good + 2];
        let len = rng.gen_range(1..=256);
        let mut overlap = sim.gen_spec(windows[n_good + 2], Want::RefusedHere(ERR_INVALID_ARGS));
        overlap.op = Op::Write;
        overlap.threshold = 0;
        overlap.layout = Layout::List(vec![
            Piece {
                local: lb,
                remote: rb,
                len,
            },
            Piece {
                local: lb + len,
                remote: rb + len / 2,
                len,
            },
        ]);
        specs.push(overlap);
    }
    specs.shuffle(&mut rng);
    sim.run(specs, true);
    let (ended, left) = sim.verify();
    assert!(ended.iter().all(|e| *e == Ended::AsWanted), "seed {seed}");
    assert!(sim.closes.is_empty(), "seed {seed}: {:?}", sim.closes);
    if !sim.fences {
        assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    }
    assert_eq!(left, 0, "seed {seed}: joins left behind");
    if n_good == 0 {
        assert!(sim.target == sim.init_target, "seed {seed}: target changed");
        assert!(sim.local == sim.init_local, "seed {seed}: local changed");
    }
    let refused = |x: &&world::Xfer| matches!(x.spec.want, Want::Refused(_));
    let singles = sim
        .xfers
        .iter()
        .filter(refused)
        .filter(|x| !x.multi())
        .count();
    let multis = sim
        .xfers
        .iter()
        .filter(refused)
        .filter(|x| x.multi())
        .count();
    (singles, multis)
}

#[test]
fn sim_out_of_range_unknown_region_wrong_key_and_local_only_are_refused() {
    let (mut singles, mut multis) = (0, 0);
    for seed in seeds(150) {
        let (s, m) = scenario_refusals(seed);
        singles += s;
        multis += m;
    }
    if all_seeds() {
        assert!(
            singles > 10 && multis > 50,
            "refused: singles {singles}, multis {multis}"
        );
    }
}

/// What must close a connection that carried some garbage.
type Closer = fn(&Cause) -> bool;

fn bad_magic(c: &Cause) -> bool {
    matches!(c, Cause::Decode(DecodeError::BadMagic(_)))
}
fn bad_chunk(c: &Cause) -> bool {
    matches!(c, Cause::Decode(DecodeError::BadChunk))
}
fn bad_join_lane(c: &Cause) -> bool {
    matches!(c, Cause::Violation(v) if v.contains("join lane"))
}
fn unexpected(c: &Cause) -> bool {
    matches!(c, Cause::Violation(v) if v.contains("unexpected"))
}
fn goaway_bye(c: &Cause) -> bool {
    matches!(c, Cause::GoAway(m) if m == "bye")
}

/// Bytes that corrupt one lane's stream right after its handshake, towards the target or
/// the initiator, and what must close the connection for them.
fn garbage(rng: &mut StdRng, n_lanes: u16, at_target: bool) -> (Vec<u8>, Closer) {
    let chunk = |join_lane| Chunk {
        tag: 1,
        uid: 1 << 60,
        chunk: 1,
        n_chunks: 2,
        mem_id: 1,
        access_key: ACCESS_KEY,
        extent: (0, 64),
        join_lane,
        segs: vec![Seg { off: 0, len: 64 }].into(),
    };
    let (frame, closer): (Frame, Closer) = match (at_target, rng.gen_range(0..4)) {
        (_, 0) => {
            let mut g: Vec<u8> = (0..rng.gen_range(HEADER_BYTES..=64))
                .map(|_| rng.gen())
                .collect();
            if g[0] == FRAME_MAGIC.to_le_bytes()[0] {
                g[0] ^= 0xff;
            }
            return (g, bad_magic);
        }
        // A join lane past MAX_LANES: the decoder refuses it.
        (true, 1) => {
            let lane = rng.gen_range(MAX_LANES..=u16::MAX);
            (
                Frame::Read {
                    chunk: chunk(lane),
                    final_: false,
                    to_device: false,
                },
                bad_chunk,
            )
        }
        // A join lane the peer does not have: `Served::check` refuses it.
        (true, 2) => {
            let lane = rng.gen_range(n_lanes..MAX_LANES);
            (
                Frame::Read {
                    chunk: chunk(lane),
                    final_: false,
                    to_device: false,
                },
                bad_join_lane,
            )
        }
        // A frame no initiator sends: `classify` refuses it.
        (true, _) => (
            Frame::Complete(Reply {
                tag: 1,
                uid: 1,
                chunk: 0,
                code: SUCCESS,
                msg: String::new(),
            }),
            unexpected,
        ),
        (false, 1) => (
            Frame::GoAway {
                code: 14,
                msg: "bye".into(),
            },
            goaway_bye,
        ),
        // A frame no target sends on a lane.
        (false, _) => (
            Frame::Hello(Hello {
                version: VERSION,
                lane: 0,
                n_lanes: 1,
                src_key: "x".into(),
                dst_key: "y".into(),
                instance: 0,
                nonce: [0; 16],
                host_tag: None,
            }),
            unexpected,
        ),
    };
    let mut b = Vec::new();
    frame.encode(0, &mut b);
    (b, closer)
}

/// Lanes of the running initiator whose connection died, and check that every close other
/// than those on `conn` is a lane killed by a transfer that ended while its WRITE was half
/// sent (a cascade of the first loss) or by a write that failed by its deadline with bytes on
/// it, or the target seeing one of them end.
fn dead_lanes(sim: &Sim, conn: Option<usize>) -> BTreeSet<u16> {
    let seed = sim.seed;
    let mut dead = BTreeSet::new();
    for (c, at_target, cause) in &sim.closes {
        if Some(*c) != conn {
            let ok = if *at_target {
                *cause == Cause::Eof
            } else {
                matches!(cause, Cause::MidFrame | Cause::Fenced)
            };
            assert!(ok, "seed {seed}: connection {c} closed by {cause:?}");
        }
        if !at_target {
            dead.insert(sim.conns[*c].lane);
        }
    }
    dead
}

/// Garbage on one lane's connection right after its handshake, towards either end: that end
/// closes it (the target with GOAWAY), the lane dies, every transfer it held work of fails,
/// transfers clear of it succeed. Towards the initiator the target handles what the lane
/// carries until the initiator reads the garbage, so a multi-chunk write may still succeed:
/// when its join was answered on another lane and that COMPLETE arrived before the lane's
/// loss (always, when the bad lane's answers come last). When the join was answered on the
/// bad lane, its COMPLETE is lost with the lane, and the write fails although the target
/// completed it.
fn scenario_garbage(seed: u64) -> [usize; 4] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9a7b);
    let n_lanes = rng.gen_range(2..=4);
    let n_x = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let bad = rng.gen_range(0..n_lanes);
    let at_target = rng.gen();
    let (bytes, closer) = garbage(&mut rng, n_lanes, at_target);
    let c = sim.conn_of(bad);
    let lagging = !at_target && rng.gen();
    if at_target {
        sim.conns[c].up.put(&bytes); // right after its HELLO
    } else {
        sim.conns[c].garbage_after_ack = Some(bytes);
        sim.conns[c].lag_when_ready = lagging;
    }
    let specs = sim.gen_specs(n_x, Want::Success);
    sim.run(specs, false);
    // The end that got the garbage closed the connection, then the other end saw it close.
    let on_bad: Vec<_> = sim.closes.iter().filter(|(cc, ..)| *cc == c).collect();
    assert_eq!(on_bad.len(), 2, "seed {seed}: {:?}", sim.closes);
    let ((_, first_at, first), (_, _, then)) = (on_bad[0], on_bad[1]);
    assert_eq!(*first_at, at_target, "seed {seed}: {:?}", sim.closes);
    assert!(closer(first), "seed {seed}: closed by {first:?}");
    let goaway = matches!(then, Cause::GoAway(_));
    assert!(
        if at_target {
            goaway
        } else {
            *then == Cause::Eof
        },
        "seed {seed}: then {then:?}"
    );
    let dead = dead_lanes(&sim, Some(c));
    let cascade = dead.len() > 1;
    let (ended, _) = sim.verify();
    if !sim.fences {
        assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    }
    let (mut hit, mut joined, mut answered_on_bad) = (0, 0, 0);
    for (x, e) in sim.xfers.iter().zip(&ended) {
        if x.plan_lanes.is_disjoint(&dead) {
            assert_eq!(
                *e,
                Ended::AsWanted,
                "seed {seed}: transfer clear of lost lanes"
            );
        }
        if !x.plan_lanes.contains(&bad) {
            continue;
        }
        hit += 1;
        let ok = *e == Ended::AsWanted;
        joined += usize::from(ok && x.multi());
        match sim.answered.get(&(x.inst, x.uid)) {
            Some(&(cc, _)) if cc == c => {
                // Its COMPLETE went down with the lane: it fails though joined.
                assert!(!ok, "seed {seed}: answered on the lost lane");
                answered_on_bad += 1;
            }
            // When the bad lane's answers come last, exactly the writes answered on another
            // lane succeed.
            Some(_) if lagging && !cascade => {
                assert_eq!(ok, x.spec.op == Op::Write, "seed {seed}")
            }
            _ if lagging && !cascade => {
                assert!(!ok && !x.multi(), "seed {seed}: never joined")
            }
            _ => {}
        }
    }
    [hit, ended.len() - hit, joined, answered_on_bad]
}

#[test]
fn sim_garbage_on_a_lane_fails_only_its_transfers() {
    let (mut lost, mut ok, mut joined, mut on_bad) = (0, 0, 0, 0);
    for seed in seeds(150) {
        let [l, o, j, b] = scenario_garbage(seed);
        lost += l;
        ok += o;
        joined += j;
        on_bad += b;
    }
    if all_seeds() {
        eprintln!(
            "{lost} transfers on the bad lane ({joined} of them joined anyway, {on_bad} \
             answered on it), {ok} clear of it"
        );
        assert!(lost > 50 && ok > 50, "lost {lost}, ok {ok}");
        assert!(joined > 5, "{joined} writes joined despite the lost lane");
        assert!(on_bad > 5, "{on_bad} joins answered on the lost lane");
    }
}

/// One connection is reset under both ends while transfers run (the target still gets a
/// random part of what was sent); later transfers dial the lane again. Every transfer the
/// lane held work of fails, the others succeed, and nothing else closes.
fn scenario_reset(seed: u64) -> [usize; 3] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4e5e7);
    let n_lanes = rng.gen_range(1..=4);
    let n_x = rng.gen_range(3..=8);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let victim = rng.gen_range(0..n_lanes);
    let specs = sim.gen_specs(n_x, Want::Success);
    let k = rng.gen_range(0..=24);
    let rest = sim.run_until(specs, true, |s| s.chunks_seen >= k && s.lane_ready(victim));
    let c = sim.conn_of(victim);
    sim.reset(c);
    sim.run(rest, true);
    let on_victim: Vec<_> = sim.closes.iter().filter(|(cc, ..)| *cc == c).collect();
    assert_eq!(
        on_victim,
        [&(c, false, Cause::Reset), &(c, true, Cause::Eof)],
        "seed {seed}: {:?}",
        sim.closes
    );
    let dead = dead_lanes(&sim, Some(c));
    let (ended, _) = sim.verify();
    for (x, e) in sim.xfers.iter().zip(&ended) {
        if x.plan_lanes.is_disjoint(&dead) {
            assert_eq!(
                *e,
                Ended::AsWanted,
                "seed {seed}: transfer clear of lost lanes"
            );
        }
    }
    let lost = ended.iter().filter(|e| **e == Ended::Lost).count();
    let redialed = usize::from(sim.conns.len() > n_lanes as usize);
    [lost, ended.len() - lost, redialed]
}

#[test]
fn sim_reset_connection_fails_only_its_transfers() {
    let mut n = [0usize; 3];
    for seed in seeds(100) {
        for (a, b) in n.iter_mut().zip(scenario_reset(seed)) {
            *a += b;
        }
    }
    if all_seeds() {
        let [lost, ok, redialed] = n;
        eprintln!("reset: {lost} lost, {ok} ok, {redialed} lanes dialed again");
        assert!(lost > 30 && ok > 100 && redialed > 10, "{n:?}");
    }
}

/// One lane delivers nothing once its handshake is done: transfers with a frame on it time
/// out through the owner's tick; the others succeed (a join waits for the stalled chunks, so
/// nothing using the lane completes early). A write among those timed out has its frames
/// whole in the stalled connection: the lane is reset before its failure is reported
/// (`Fence::Unplaced`), so that its bytes cannot land later. Without one (only reads timed
/// out), when the lane wakes up every chunk reaches the target, every join answers, and
/// the late answers are dropped as stale.
fn scenario_stall(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x57a11);
    let n_lanes = rng.gen_range(2..=4);
    let n_x = rng.gen_range(2..=6);
    let deadline = 1 << 40;
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let stalled = rng.gen_range(0..n_lanes);
    let c = sim.conn_of(stalled);
    sim.conns[c].stall_when_ready = true;
    // Its writer sends everything into the stalled connection.
    sim.sndbuf = usize::MAX;
    let mut specs = sim.gen_specs(n_x, Want::Success);
    for s in &mut specs {
        s.timeout = deadline;
    }
    sim.run(specs, false);
    let mut writes_on_stalled = 0;
    for (x, xf) in sim.xfers.iter_mut().enumerate() {
        let on_stalled = xf.frame_lanes.contains(&stalled);
        assert_eq!(
            xf.result.is_none(),
            on_stalled,
            "seed {seed}: transfer {x} before the deadline"
        );
        if on_stalled {
            xf.spec.want = Want::TimedOut;
            writes_on_stalled += usize::from(xf.spec.op == Op::Write);
        }
    }
    sim.advance(deadline - 1);
    let done = |sim: &Sim| sim.xfers.iter().filter(|x| x.result.is_some()).count();
    let before = done(&sim);
    sim.advance(deadline);
    assert_eq!(done(&sim), sim.xfers.len(), "seed {seed}: deadline");
    let fenced = writes_on_stalled > 0;
    let reset_before = sim.closes.clone();
    // Wake the lane: what it still carries is answered late and must be dropped.
    sim.conns[c].stalled = false;
    let stale_before = sim.stale;
    sim.run(Vec::new(), false);
    let (ended, left) = sim.verify();
    let timed_out = ended.iter().filter(|e| **e == Ended::TimedOut).count();
    assert_eq!(timed_out, sim.xfers.len() - before, "seed {seed}");
    if !sim.fences {
        assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    }
    if fenced {
        // Reset at the deadline, before any status was set; the target then sees it end.
        assert_eq!(
            reset_before,
            [(c, false, Cause::Fenced)],
            "seed {seed}: {writes_on_stalled} writes timed out on the stalled lane"
        );
        for (cc, at_target, cause) in &sim.closes {
            assert_eq!(*cc, c, "seed {seed}: {:?}", sim.closes);
            assert!(
                *at_target || *cause == Cause::Fenced,
                "seed {seed}: {cause:?}"
            );
        }
        return (timed_out, ended.len() - timed_out);
    }
    // Each timed-out read's final answer arrives after the wake-up.
    assert!(
        sim.stale - stale_before >= timed_out,
        "seed {seed}: {} late answers for {timed_out} timed-out transfers",
        sim.stale - stale_before
    );
    assert!(sim.closes.is_empty(), "seed {seed}: {:?}", sim.closes);
    // Nothing was lost: every transfer's inbound status ends up recorded, every join done.
    assert_eq!(sim.inbound.len(), sim.xfers.len(), "seed {seed}: inbound");
    assert_eq!(left, 0, "seed {seed}: joins left behind");
    (timed_out, ended.len() - timed_out)
}

#[test]
fn sim_stalled_lane_times_out_only_its_transfers() {
    let (mut timed_out, mut ok) = (0, 0);
    for seed in seeds(100) {
        let (t, o) = scenario_stall(seed);
        timed_out += t;
        ok += o;
    }
    if all_seeds() {
        assert!(timed_out > 30 && ok > 30, "timed out {timed_out}, ok {ok}");
    }
}

/// Transfers with deadlines that often pass while they run: each succeeds or times out
/// (answers that come later are dropped); a transfer that ends while a lane is half-way
/// through one of its WRITEs kills that lane (its memory must not be read any more), which
/// fails whatever else the lane held.
fn scenario_deadlines(seed: u64) -> [usize; 4] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xdead1);
    let n_lanes = rng.gen_range(1..=4);
    let n_x = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let mut specs = sim.gen_specs(n_x, Want::SuccessOrTimeout);
    for s in &mut specs {
        if rng.gen_ratio(3, 4) {
            s.timeout = rng.gen_range(1..=4000);
        } else {
            s.want = Want::Success;
        }
    }
    sim.run(specs, true);
    dead_lanes(&sim, None);
    let (ended, _) = sim.verify();
    let count = |w| ended.iter().filter(|e| **e == w).count();
    let mid_frame = sim.closes.len() / 2;
    [
        count(Ended::TimedOut),
        count(Ended::AsWanted),
        mid_frame,
        count(Ended::Lost),
    ]
}

#[test]
fn sim_deadlines_time_out_and_cancel_mid_frame() {
    let mut n = [0usize; 4];
    for seed in seeds(100) {
        for (a, b) in n.iter_mut().zip(scenario_deadlines(seed)) {
            *a += b;
        }
    }
    if all_seeds() {
        let [timed_out, ok, mid_frame, lost] = n;
        eprintln!(
            "deadlines: {timed_out} timed out, {ok} ok, {mid_frame} lanes died mid-frame, \
             {lost} transfers lost with them"
        );
        assert!(timed_out > 50 && ok > 50 && mid_frame > 5, "{n:?}");
    }
}

/// Transfers of which one chunk fails on the initiator, next to good ones. A write's chunk
/// whose staging copy fails (while its other chunks are on the wire) never leaves: the
/// target's join can never complete, so a multi-chunk write sends FINISH on its home lane,
/// the target records FINISH's code and ends the join, and FINISH's COMPLETE ends the
/// transfer (the join is left for the target to prune); a one-chunk write completes at once,
/// unseen by the target. A read's chunk whose data cannot be placed is that chunk's error,
/// which wins over the join's SUCCESS. A failed multi-chunk transfer is cancelled on its
/// lanes, so one of them may die half-way through another of its chunks.
fn scenario_local_failure(seed: u64) -> [usize; 7] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ca1);
    let n_lanes = rng.gen_range(1..=4);
    let n_x = rng.gen_range(2..=6);
    let forced = rng.gen_range(0..n_x);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let mut specs = sim.gen_specs(n_x, Want::Success);
    for (i, s) in specs.iter_mut().enumerate() {
        if i == forced || rng.gen_ratio(1, 3) {
            s.local_failure = true;
            s.want = Want::LocalFailure;
        }
    }
    sim.run(specs, true);
    dead_lanes(&sim, None);
    let (ended, left) = sim.verify();
    let failed = |op: Op, multi: bool| {
        sim.xfers
            .iter()
            .zip(&ended)
            .filter(|(x, e)| {
                x.fail_chunk.is_some()
                    && x.spec.op == op
                    && x.multi() == multi
                    && **e != Ended::Lost
            })
            .count()
    };
    let (multi_writes, single_writes) = (failed(Op::Write, true), failed(Op::Write, false));
    // Those that failed chunk 0, so that their home lane carried FINISH without it.
    let chunk0_writes = sim
        .xfers
        .iter()
        .filter(|x| x.spec.op == Op::Write && x.multi() && x.fail_chunk == Some(0))
        .count();
    // One FINISH per failed multi-chunk write that ended as it had to (with fences, one on
    // each lane that carried chunks of it, and none where every such lane died first:
    // only those its target heard of count); each leaves its join (which lacks the failed
    // chunk) behind.
    let heard = if sim.fences {
        sim.xfers
            .iter()
            .zip(&ended)
            .filter(|(x, e)| {
                x.fail_chunk.is_some()
                    && x.spec.op == Op::Write
                    && x.multi()
                    && **e != Ended::Lost
                    && sim.inbound.contains_key(&(x.inst, x.uid))
            })
            .count()
    } else {
        multi_writes
    };
    assert!(sim.finishes >= heard, "seed {seed}: FINISH frames");
    assert!(left >= heard, "seed {seed}: joins left behind");
    let lost = ended.iter().filter(|e| **e == Ended::Lost).count();
    if sim.closes.is_empty() {
        if sim.fences {
            assert!(sim.finishes >= multi_writes, "seed {seed}: FINISH frames");
        } else {
            assert_eq!(sim.finishes, multi_writes, "seed {seed}: FINISH frames");
        }
        assert_eq!(left, multi_writes, "seed {seed}: joins left behind");
        assert_eq!(sim.stale, 0, "seed {seed}: stale answers");
        let multi = sim.xfers.iter().filter(|x| x.multi()).count();
        assert_eq!(
            sim.answered.len(),
            multi - multi_writes,
            "seed {seed}: joins answered"
        );
    }
    [
        multi_writes,
        single_writes,
        chunk0_writes,
        failed(Op::Read, true),
        failed(Op::Read, false),
        lost,
        sim.fenced,
    ]
}

#[test]
fn sim_local_failure_finishes_the_transfer() {
    let mut n = [0usize; 7];
    for seed in seeds(150) {
        for (a, b) in n.iter_mut().zip(scenario_local_failure(seed)) {
            *a += b;
        }
    }
    if all_seeds() {
        let [mw, sw, c0, mr, sr, lost, fenced] = n;
        eprintln!(
            "failed: {mw} multi-chunk writes ({c0} at chunk 0), {sw} one-chunk writes, \
             {mr} multi-chunk reads, {sr} one-chunk reads; {lost} transfers lost to a lane \
             that died mid-frame; {fenced} writes fenced"
        );
        assert!(mw > 40 && c0 > 5 && mr > 40, "{n:?}");
        // Even seeds fence a failed write on every lane it used (protocol v11).
        assert!(fenced > 20, "{n:?}");
        assert!(sw > 3 && sr > 3, "{n:?}");
    }
}

/// The initiator crashes while its transfers run and starts again: a new instance, the
/// same key, uids from the start, new memory contents, and the same requests in the same
/// order (so the same uids with the same shapes on the same lanes) into other windows. The
/// target still holds the joins of the old instance's unfinished transfers, and the old
/// connections still deliver what they had sent, interleaved with the new traffic. Every new
/// transfer must succeed on its own chunks alone, and the old joins stay apart.
fn scenario_restart(seed: u64) -> [usize; 3] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x2e57a27);
    let n_lanes = rng.gen_range(1..=4);
    let n = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes, rng.gen_range(1..=3));
    let windows = sim.windows(2 * n);
    let old: Vec<Spec> = windows[..n]
        .iter()
        .map(|&w| sim.gen_spec(w, Want::Success))
        .collect();
    let new: Vec<Spec> = old
        .iter()
        .zip(&windows[n..])
        .zip(&windows[..n])
        .map(|((s, to), from)| {
            let dl = to.0 as i64 - from.0 as i64;
            let dr = to.2 as i64 - from.2 as i64;
            Spec {
                layout: shift(&s.layout, dl, dr),
                ..s.clone()
            }
        })
        .collect();
    let k = rng.gen_range(1..=40);
    let unstarted = sim.run_until(old, false, |s| s.chunks_seen >= k);
    assert!(unstarted.is_empty());
    sim.crash();
    let mut local = vec![0u8; sim.local.len()];
    rng.fill(&mut local[..]);
    sim.local.copy_from_slice(&local);
    sim.init_local = local;
    sim.start_instance();
    let held = sim.joins.map.borrow().len();
    sim.run(new, true);
    let (ended, left) = sim.verify();
    for (x, e) in sim.xfers.iter().zip(&ended) {
        let want = if x.inst == 0 {
            Ended::Abandoned
        } else {
            Ended::AsWanted
        };
        assert!(
            x.inst == 0 || x.uid < n as u64,
            "seed {seed}: uids start over"
        );
        assert_eq!(*e, want, "seed {seed}: transfer {}/{}", x.inst, x.uid);
    }
    // Only the old connections close (the target sees them end), nothing of the new ones.
    for (c, at_target, cause) in &sim.closes {
        assert!(
            sim.conns[*c].inst == 0 && *at_target && *cause == Cause::Eof,
            "seed {seed}: connection {c} closed by {cause:?}"
        );
    }
    assert_eq!((sim.stale, sim.late_reports), (0, 0), "seed {seed}");
    // New transfers whose uid names an old join the target still held.
    let collided = sim
        .xfers
        .iter()
        .filter(|x| x.inst == 1 && x.multi())
        .filter(|x| {
            sim.seen
                .get(&(0, x.uid))
                .is_some_and(|s| s.chunks.len() < s.n_chunks as usize)
        })
        .count();
    let abandoned = ended.iter().filter(|e| **e == Ended::Abandoned).count();
    assert!(left <= abandoned, "seed {seed}: new joins left behind");
    [held, collided, abandoned]
}

#[test]
fn sim_restarted_initiator_is_not_confused_with_its_predecessor() {
    let mut n = [0usize; 3];
    for seed in seeds(120) {
        for (a, b) in n.iter_mut().zip(scenario_restart(seed)) {
            *a += b;
        }
    }
    if all_seeds() {
        let [held, collided, abandoned] = n;
        eprintln!(
            "restart: {abandoned} transfers abandoned, {held} old joins held at the restart, \
             {collided} new transfers reusing the uid of an unfinished old join"
        );
        assert!(held > 50 && collided > 50, "{n:?}");
    }
}

#[test]
fn the_timeout_message_is_the_owners() {
    // The checks tell timeouts by their message: it must be the one `Outbound` gives.
    let mut o = morio::proto::outbound::Outbound::new(1, 5, false);
    match o.on_tick(5) {
        Some(morio::proto::outbound::Action::Complete { msg, .. }) => assert_eq!(msg, TIMEOUT),
        a => panic!("{a:?}"),
    }
}
