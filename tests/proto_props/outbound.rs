//! The initiator's `Outbound` state machine: joined transfers with results in any order,
//! duplicates and strays; local failures that ask for FINISH; lane loss and deadlines that
//! end a transfer once; one-chunk transfers.

use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, SUCCESS};
use morio::proto::outbound::{Action, Outbound, Phase, Violation};
use proptest::prelude::*;
use proptest::sample::select;

use crate::strategies::{config, terminal_code, TERMINAL};

proptest! {
    #![proptest_config(config(512))]

    /// A joined transfer: chunk results in any order (a write reports only its errors, a
    /// read every chunk), with duplicates and strays, and the target's COMPLETE at any point
    /// among them. A write ends at COMPLETE, a read once COMPLETE and every chunk are in;
    /// the first chunk error wins over COMPLETE's code; nothing is accepted after the end.
    #[test]
    fn outbound_multi_chunk(
        order in (2..40u32).prop_flat_map(|n| Just((0..n).collect::<Vec<u32>>()).prop_shuffle()),
        codes in proptest::collection::vec(prop_oneof![6 => Just(SUCCESS), 1 => select(TERMINAL[1..].to_vec())], 40),
        complete_code in terminal_code(),
        complete_at in any::<prop::sample::Index>(),
        dup_at in any::<prop::sample::Index>(),
        read in any::<bool>(),
    ) {
        let n = order.len() as u32;
        let mut o = Outbound::new(n, 100, read);
        prop_assert_eq!(o.on_chunk(n, SUCCESS, ""), Err(Violation::UnknownChunk(n)));
        // Chunk results reported: all of a read's, only the errors of a write.
        let reported: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&c| read || codes[c as usize] != SUCCESS)
            .collect();
        let at = complete_at.index(reported.len() + 1);
        let mut first_err: Option<(u32, String)> = None;
        let mut ended = None;
        let feed_complete = |o: &mut Outbound, first_err: &Option<(u32, String)>, left: usize| {
            let act = o.on_complete(complete_code, "target").unwrap();
            let want = match first_err {
                Some((c, m)) => Action::Complete { code: *c, msg: m.clone() },
                None => Action::Complete { code: complete_code, msg: "target".into() },
            };
            (act, want, left)
        };
        for (k, &c) in reported.iter().enumerate() {
            if k == at {
                let (act, want, left) = feed_complete(&mut o, &first_err, reported.len() - k);
                if !read {
                    prop_assert_eq!(act, Some(want));
                    ended = Some(k);
                    break;
                }
                prop_assert!(left > 0);
                prop_assert_eq!(act, None, "a read waits for its data");
                prop_assert!(o.on_complete(SUCCESS, "").is_err(), "COMPLETE twice");
            }
            let code = codes[c as usize];
            let msg = format!("chunk {c}");
            if code != SUCCESS && first_err.is_none() {
                first_err = Some((code, msg.clone()));
            }
            let act = o.on_chunk(c, code, &msg).unwrap();
            if act.is_none() && k == dup_at.index(reported.len()) {
                prop_assert_eq!(o.on_chunk(c, SUCCESS, ""), Err(Violation::DuplicateChunk(c)));
            }
            if read && k + 1 == reported.len() && at <= k {
                let (code, msg) = first_err.clone().unwrap_or((complete_code, "target".into()));
                prop_assert_eq!(act, Some(Action::Complete { code, msg }));
                ended = Some(k);
            } else {
                prop_assert_eq!(act, None);
                prop_assert_eq!(o.phase(), Phase::Chunks);
            }
        }
        if ended.is_none() {
            prop_assert_eq!(at, reported.len());
            let (act, want, _) = feed_complete(&mut o, &first_err, 0);
            prop_assert_eq!(act, Some(want));
        }
        prop_assert_eq!(o.phase(), Phase::Done);
        prop_assert_eq!(o.on_tick(1000), None);
        prop_assert_eq!(o.on_lane_lost("late"), None);
        prop_assert!(o.on_complete(SUCCESS, "").is_err());
        prop_assert!(o.on_chunk(order[0], SUCCESS, "").is_err());
    }

    /// A chunk that fails before it leaves: a multi-chunk transfer asks for FINISH once,
    /// keeps taking late chunk results, and ends with the first error at FINISH's COMPLETE.
    #[test]
    fn outbound_local_failure_finishes(
        n in 2..20u32,
        before in 0..20u32,
        read in any::<bool>(),
        code in select(TERMINAL[1..].to_vec()),
    ) {
        let mut o = Outbound::new(n, 100, read);
        let before = before.min(n - 1);
        for c in 0..before {
            prop_assert_eq!(o.on_chunk(c, SUCCESS, "").unwrap(), None);
        }
        prop_assert_eq!(
            o.on_local_failure(code, "local"),
            Some(Action::SendFinish { code, msg: "local".into() })
        );
        prop_assert_eq!(o.phase(), Phase::Finishing);
        prop_assert_eq!(o.on_local_failure(ERR_BAD_STATE, "again"), None);
        if before + 1 < n {
            prop_assert_eq!(o.on_chunk(n - 1, SUCCESS, "").unwrap(), None);
        }
        prop_assert_eq!(
            o.on_complete(code, "local").unwrap(),
            Some(Action::Complete { code, msg: "local".into() })
        );
        prop_assert_eq!(o.phase(), Phase::Done);
    }

    /// Lane loss or the deadline end a transfer with ERR_BAD_STATE from any live phase, once.
    #[test]
    fn outbound_fails_once(
        n in 1..10u32,
        answered in 0..10u32,
        deadline in 1..1000u64,
        by_tick in any::<bool>(),
    ) {
        let mut o = Outbound::new(n, deadline, by_tick);
        prop_assert_eq!(o.deadline(), deadline);
        if n > 1 {
            for c in 0..answered.min(n) {
                let _ = o.on_chunk(c, SUCCESS, "").unwrap();
            }
        }
        prop_assert_eq!(o.on_tick(deadline - 1), None);
        let act = if by_tick { o.on_tick(deadline) } else { o.on_lane_lost("lane lost") };
        let failed = matches!(act, Some(Action::Complete { code: ERR_BAD_STATE, .. }));
 prop_assert!(failed, "{:?}", act);
        prop_assert_eq!(o.phase(), Phase::Done);
        prop_assert_eq!(o.on_lane_lost("again"), None);
        prop_assert_eq!(o.on_tick(u64::MAX), None);
        prop_assert!(o.on_complete(SUCCESS, "").is_err());
        prop_assert!(o.on_chunk(0, SUCCESS, "").is_err());
    }
}

#[test]
fn outbound_single_chunk() {
    for code in TERMINAL {
        let mut o = Outbound::new(1, 10, code % 2 == 0);
        assert_eq!(
            o.on_chunk(0, SUCCESS, ""),
            Err(Violation::WrongPhase(Phase::Chunks))
        );
        assert_eq!(
            o.on_complete(code, "m").unwrap(),
            Some(Action::Complete {
                code,
                msg: "m".into()
            })
        );
        assert_eq!(o.on_lane_lost("x"), None);
    }
    assert_eq!(
        Outbound::new(1, 10, false).on_local_failure(ERR_GPU_OP, "gpu"),
        Some(Action::Complete {
            code: ERR_GPU_OP,
            msg: "gpu".into()
        })
    );
}
