//! Transfer sizes from 1 byte to 256 MiB at odd offsets, many-segment batches checked against
//! a model, and the engine-level batch API (one uid and status per pair).

use morio::{IoEngine, MemoryDesc, StatusCode};
use rand::{seq::SliceRandom, Rng, SeedableRng};

use super::common::*;

/// Write `n` bytes from a's buffer at an odd offset into b's buffer at another, then read them
/// back into a third buffer at a third offset; every byte, and every byte around, checked.
fn write_then_read_back(a: &IoEngine, b: &IoEngine, n: usize, seed: u64) {
    let (off_src, off_dst, off_back) = (3usize, 1031usize, 13usize);
    let slack = 29;
    let src = a
        .register_buffer(random_big(off_src + n + slack, seed))
        .unwrap();
    let dst_init = random_big(off_dst + n + slack, seed + 1);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let back_init = random_big(off_back + n + slack, seed + 2);
    let back = a.register_buffer(back_init.clone()).unwrap();
    let payload = bytes_at(&src, off_src, n);

    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), off_src, dst.desc(), off_dst, n, uid);
    assert_ok(&st, &format!("write of {n} bytes"));
    assert_eq!(inbound(b, a.key(), uid), StatusCode::Success);
    let mut want = dst_init;
    want[off_dst..off_dst + n].copy_from_slice(&payload);
    assert_bytes_eq(
        &dst.to_vec(),
        &want,
        &format!("target after writing {n} bytes"),
    );
    drop(want);

    let uid = a.allocate_transfer_uid();
    let st = a.read(back.desc(), off_back, dst.desc(), off_dst, n, uid);
    assert_ok(&st, &format!("read of {n} bytes"));
    assert_eq!(inbound(b, a.key(), uid), StatusCode::Success);
    let mut want = back_init;
    want[off_back..off_back + n].copy_from_slice(&payload);
    assert_bytes_eq(
        &back.to_vec(),
        &want,
        &format!("local after reading {n} bytes"),
    );
}

fn size_case(n: usize) {
    let (a, b) = pair(&format!("size{n}"), test_cfg());
    write_then_read_back(&a, &b, n, n as u64);
}

#[test]
fn size_1_byte() {
    size_case(1);
}

#[test]
fn size_7_bytes() {
    size_case(7);
}

#[test]
fn size_4095() {
    size_case(4095);
}

#[test]
fn size_4096() {
    size_case(4096);
}

#[test]
fn size_65535_just_below_striping() {
    size_case(65535);
}

#[test]
fn size_65536_striping_threshold() {
    size_case(65536);
}

#[test]
fn size_65537() {
    size_case(65537);
}

#[test]
fn size_1_mib_plus_3() {
    size_case((1 << 20) + 3);
}

#[test]
fn size_17_mib() {
    size_case(17 << 20);
}

#[test]
fn size_256_mib() {
    // Default chunk_bytes (1 MiB): 256 stripes over 8 lanes.
    let cfg = test_cfg();
    assert_eq!(cfg.chunk_bytes, 1 << 20);
    let (a, b) = pair("size256m", cfg);
    write_then_read_back(&a, &b, 256 << 20, 256);
}

#[test]
fn sizes_on_one_engine_pair_in_sequence() {
    // The same sizes through one pair, so lanes are reused across sizes and modes.
    let (a, b) = pair("size_seq", test_cfg());
    for (i, n) in [1usize, 7, 4095, 4096, 65535, 65536, 65537, (1 << 20) + 3]
        .into_iter()
        .enumerate()
    {
        write_then_read_back(&a, &b, n, 1000 + i as u64 * 7);
    }
}

#[test]
fn batch_256_segments_of_8_bytes_strided() {
    let (a, b) = pair("batch256x8", test_cfg());
    let n = 256;
    let local = random_buffer(&a, n * 16 + 5, 80);
    let remote_init = random_bytes(n * 32 + 11, 81);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    let lo: Vec<usize> = (0..n).map(|i| 5 + i * 16).collect();
    let ro: Vec<usize> = (0..n).map(|i| 11 + i * 32).collect();
    let sz = vec![8usize; n];
    let sess = a.create_session(local.desc(), remote.desc()).unwrap();

    let uid = sess.allocate_transfer_uid();
    assert_ok(&sess.batch_write(&lo, &ro, &sz, uid), "strided batch_write");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let l = local.to_vec();
    let mut model = remote_init;
    for i in 0..n {
        model[ro[i]..ro[i] + 8].copy_from_slice(&l[lo[i]..lo[i] + 8]);
    }
    assert_bytes_eq(&remote.to_vec(), &model, "strided batch_write");

    // Fresh remote bytes, read back strided into the local buffer.
    let fresh = random_bytes(model.len(), 82);
    remote.write_at(0, &fresh);
    let local_before = local.to_vec();
    let uid = sess.allocate_transfer_uid();
    assert_ok(&sess.batch_read(&lo, &ro, &sz, uid), "strided batch_read");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let mut want = local_before;
    for i in 0..n {
        want[lo[i]..lo[i] + 8].copy_from_slice(&fresh[ro[i]..ro[i] + 8]);
    }
    assert_bytes_eq(&local.to_vec(), &want, "strided batch_read");
}

/// `sizes.len()` non-overlapping ranges in a region, placed in a random order with random
/// gaps (sometimes none); returns the offsets (in `sizes` order) and the region size.
fn scatter(sizes: &[usize], rng: &mut impl Rng) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.shuffle(rng);
    let mut offs = vec![0; sizes.len()];
    let mut at = rng.gen_range(0..64);
    for i in order {
        offs[i] = at;
        at += sizes[i]
            + if rng.gen_bool(0.2) {
                0
            } else {
                rng.gen_range(1..100)
            };
    }
    (offs, at + 17)
}

#[test]
fn batch_1000_random_segments_against_a_model() {
    let (a, b) = pair("batch1000", test_cfg());
    let mut rng = rand::rngs::StdRng::seed_from_u64(90);
    let sizes: Vec<usize> = (0..1000).map(|_| rng.gen_range(1..5000)).collect();
    let (lo, l_len) = scatter(&sizes, &mut rng);
    let (ro, r_len) = scatter(&sizes, &mut rng);
    let local = a.register_buffer(random_bytes(l_len, 91)).unwrap();
    let remote_init = random_bytes(r_len, 92);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    let sess = a.create_session(local.desc(), remote.desc()).unwrap();

    // ~2.5 MB in total: striped over every lane.
    let uid = sess.allocate_transfer_uid();
    assert_ok(
        &sess.batch_write(&lo, &ro, &sizes, uid),
        "batch_write of 1000 segments",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let l = local.to_vec();
    let mut model = remote_init;
    for i in 0..sizes.len() {
        model[ro[i]..ro[i] + sizes[i]].copy_from_slice(&l[lo[i]..lo[i] + sizes[i]]);
    }
    assert_bytes_eq(&remote.to_vec(), &model, "1000-segment batch_write");

    // Read them back into a different local layout of a second buffer.
    let (lo2, l2_len) = scatter(&sizes, &mut rng);
    let back_init = random_bytes(l2_len, 93);
    let back = a.register_buffer(back_init.clone()).unwrap();
    let fresh = random_bytes(r_len, 94);
    remote.write_at(0, &fresh);
    let sess2 = a.create_session(back.desc(), remote.desc()).unwrap();
    let uid = sess2.allocate_transfer_uid();
    assert_ok(
        &sess2.batch_read(&lo2, &ro, &sizes, uid),
        "batch_read of 1000 segments",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let mut want = back_init;
    for i in 0..sizes.len() {
        want[lo2[i]..lo2[i] + sizes[i]].copy_from_slice(&fresh[ro[i]..ro[i] + sizes[i]]);
    }
    assert_bytes_eq(&back.to_vec(), &want, "1000-segment batch_read");
}

#[test]
fn engine_batch_write_and_read_three_pairs() {
    let (a, b) = pair("batch3", test_cfg());
    let sizes_of = [
        vec![100usize, 7, 3000],
        vec![1usize],
        vec![70_000usize, 70_000],
    ];
    let locals: Vec<_> = (0..3)
        .map(|i| a.register_buffer(random_bytes(200_000, 100 + i)).unwrap())
        .collect();
    let remote_inits: Vec<_> = (0..3).map(|i| random_bytes(200_000, 110 + i)).collect();
    let remotes: Vec<_> = remote_inits
        .iter()
        .map(|v| b.register_buffer(v.clone()).unwrap())
        .collect();
    let lo = vec![vec![0usize, 500, 1000], vec![9], vec![10, 80_010]];
    let ro = vec![vec![50usize, 400, 5000], vec![199_999], vec![0, 100_000]];
    let l_md: Vec<MemoryDesc> = locals.iter().map(|x| x.desc().clone()).collect();
    let r_md: Vec<MemoryDesc> = remotes.iter().map(|x| x.desc().clone()).collect();
    let uids: Vec<u64> = (0..3).map(|_| a.allocate_transfer_uid()).collect();

    let sts = a.batch_write(&l_md, &lo, &r_md, &ro, &sizes_of, &uids);
    assert_eq!(sts.len(), 3, "one status per pair");
    assert_eq!(a.wait_all(&sts, 60_000), StatusCode::Success);
    for (i, st) in sts.iter().enumerate() {
        assert_eq!(st.code(), StatusCode::Success, "pair {i}: {}", st.message());
        assert_eq!(
            inbound(&b, a.key(), uids[i]),
            StatusCode::Success,
            "pair {i}"
        );
        let l = locals[i].to_vec();
        let mut want = remote_inits[i].clone();
        for j in 0..sizes_of[i].len() {
            let (s, d, z) = (lo[i][j], ro[i][j], sizes_of[i][j]);
            want[d..d + z].copy_from_slice(&l[s..s + z]);
        }
        assert_bytes_eq(&remotes[i].to_vec(), &want, &format!("pair {i} written"));
    }

    // batch_read of the same pairs with fresh remote data.
    let fresh: Vec<_> = (0..3).map(|i| random_bytes(200_000, 120 + i)).collect();
    for i in 0..3 {
        remotes[i].write_at(0, &fresh[i]);
    }
    let before: Vec<_> = locals.iter().map(|x| x.to_vec()).collect();
    let uids: Vec<u64> = (0..3).map(|_| a.allocate_transfer_uid()).collect();
    let sts = a.batch_read(&l_md, &lo, &r_md, &ro, &sizes_of, &uids);
    assert_eq!(sts.len(), 3);
    assert_eq!(a.wait_all(&sts, -1), StatusCode::Success);
    for i in 0..3 {
        assert_eq!(
            inbound(&b, a.key(), uids[i]),
            StatusCode::Success,
            "pair {i}"
        );
        let mut want = before[i].clone();
        for j in 0..sizes_of[i].len() {
            let (s, d, z) = (lo[i][j], ro[i][j], sizes_of[i][j]);
            want[s..s + z].copy_from_slice(&fresh[i][d..d + z]);
        }
        assert_bytes_eq(&locals[i].to_vec(), &want, &format!("pair {i} read"));
    }

    // Outer lists of different lengths: every status ERR_INVALID_ARGS at once, nothing moved.
    let snapshot: Vec<_> = remotes.iter().map(|x| x.to_vec()).collect();
    let uids: Vec<u64> = (0..3).map(|_| a.allocate_transfer_uid()).collect();
    let bad = [
        a.batch_write(&l_md[..2], &lo, &r_md, &ro, &sizes_of, &uids),
        a.batch_write(&l_md, &lo, &r_md, &ro[..2], &sizes_of, &uids),
        a.batch_write(&l_md, &lo, &r_md, &ro, &sizes_of[..1], &uids),
        a.batch_write(&l_md, &lo, &r_md, &ro, &sizes_of, &uids[..2]),
        a.batch_read(&l_md, &lo[..1], &r_md, &ro, &sizes_of, &uids),
    ];
    for (k, sts) in bad.iter().enumerate() {
        assert!(!sts.is_empty(), "case {k}: no status to report the error");
        for st in sts {
            assert_eq!(
                st.code(),
                StatusCode::ErrInvalidArgs,
                "case {k}: {}",
                st.message()
            );
        }
    }
    // An inner mismatch fails only its own pair.
    let mut sizes_bad = sizes_of.clone();
    sizes_bad[1] = vec![1, 1];
    let sts = a.batch_write(&l_md, &lo, &r_md, &ro, &sizes_bad, &uids);
    assert_eq!(
        sts[1].code(),
        StatusCode::ErrInvalidArgs,
        "{}",
        sts[1].message()
    );
    assert_eq!(wait(&sts[0]), StatusCode::Success);
    assert_eq!(wait(&sts[2]), StatusCode::Success);
    assert_bytes_eq(
        &remotes[1].to_vec(),
        &snapshot[1],
        "pair with the inner mismatch",
    );
}

/// Ascending, disjoint segments (the receiver scatters each chunk's payload over them with
/// vectored reads), with chunk cuts inside segments; striped and on a single lane.
fn ascending_batch(prefix: &str, cfg: morio::TcpBackendConfig, seed: u64) {
    let (a, b) = pair(prefix, cfg);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sizes: Vec<usize> = (0..600).map(|_| rng.gen_range(1..5000)).collect();
    let ascending = |rng: &mut rand::rngs::StdRng| {
        let mut at = rng.gen_range(0..64);
        let offs: Vec<usize> = sizes
            .iter()
            .map(|&s| {
                let o = at;
                at += s + rng.gen_range(0..3) * rng.gen_range(1..50);
                o
            })
            .collect();
        (offs, at + 5)
    };
    let (lo, l_len) = ascending(&mut rng);
    let (ro, r_len) = ascending(&mut rng);
    let local = a.register_buffer(random_bytes(l_len, seed + 1)).unwrap();
    let remote_init = random_bytes(r_len, seed + 2);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    let sess = a.create_session(local.desc(), remote.desc()).unwrap();
    let uid = sess.allocate_transfer_uid();
    assert_ok(
        &sess.batch_write(&lo, &ro, &sizes, uid),
        "ascending batch_write",
    );
    let l = local.to_vec();
    let mut model = remote_init;
    for i in 0..sizes.len() {
        model[ro[i]..ro[i] + sizes[i]].copy_from_slice(&l[lo[i]..lo[i] + sizes[i]]);
    }
    assert_bytes_eq(&remote.to_vec(), &model, "ascending batch_write");
    let fresh = random_bytes(r_len, seed + 3);
    remote.write_at(0, &fresh);
    let back_init = random_bytes(l_len, seed + 4);
    let back = a.register_buffer(back_init.clone()).unwrap();
    let sess2 = a.create_session(back.desc(), remote.desc()).unwrap();
    let uid = sess2.allocate_transfer_uid();
    assert_ok(
        &sess2.batch_read(&lo, &ro, &sizes, uid),
        "ascending batch_read",
    );
    let mut want = back_init;
    for i in 0..sizes.len() {
        want[lo[i]..lo[i] + sizes[i]].copy_from_slice(&fresh[ro[i]..ro[i] + sizes[i]]);
    }
    assert_bytes_eq(&back.to_vec(), &want, "ascending batch_read");
}

#[test]
fn batch_ascending_segments_striped() {
    ascending_batch("ascstriped", test_cfg(), 300);
}

#[test]
fn batch_ascending_segments_one_lane_small_chunks() {
    let cfg = cfg_with(|c| {
        c.num_data_conns = 1;
        c.chunk_bytes = 256 << 10;
        c.same_host_chunk_bytes = 256 << 10;
    });
    ascending_batch("asconelane", cfg, 400);
}

/// A batch of `n` segments of `len` bytes at constant strides (the layout that travels as a
/// stride and is framed as runs), written and read back, every byte checked against a model.
fn strided_round_trip(prefix: &str, cfg: morio::TcpBackendConfig, n: usize, len: usize) {
    let (a, b) = pair(prefix, cfg);
    let (l0, ls, r0, rs) = (3usize, len + 1, 7usize, len + 13);
    let local = random_buffer(&a, l0 + n * ls + 5, 90);
    let remote_init = random_bytes(r0 + n * rs + 5, 91);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    let lo: Vec<usize> = (0..n).map(|i| l0 + i * ls).collect();
    let ro: Vec<usize> = (0..n).map(|i| r0 + i * rs).collect();
    let sz = vec![len; n];
    let sess = a.create_session(local.desc(), remote.desc()).unwrap();
    let uid = sess.allocate_transfer_uid();
    assert_ok(&sess.batch_write(&lo, &ro, &sz, uid), "strided batch_write");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let l = local.to_vec();
    let mut model = remote_init;
    for i in 0..n {
        model[ro[i]..ro[i] + len].copy_from_slice(&l[lo[i]..lo[i] + len]);
    }
    assert_bytes_eq(&remote.to_vec(), &model, "strided batch_write");

    let fresh = random_bytes(model.len(), 92);
    remote.write_at(0, &fresh);
    let local_before = local.to_vec();
    let uid = sess.allocate_transfer_uid();
    assert_ok(&sess.batch_read(&lo, &ro, &sz, uid), "strided batch_read");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let mut want = local_before;
    for i in 0..n {
        want[lo[i]..lo[i] + len].copy_from_slice(&fresh[ro[i]..ro[i] + len]);
    }
    assert_bytes_eq(&local.to_vec(), &want, "strided batch_read");
}

/// Small strided batches of every piece size a fixed-size copy handles (1, 2, 4, 8, 16,
/// 32) and of sizes around them, each written and read back through one engine pair: the
/// pieces go next to their frames (express, or inline on a lane), are placed by run on the
/// target and, for a read, gathered by run there and placed by run here.
#[test]
fn strided_batches_of_small_pieces_of_every_size() {
    let (a, b) = pair("stridesmallsizes", test_cfg());
    for (k, len) in [1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40]
        .into_iter()
        .enumerate()
    {
        let n = 64 + k;
        let (l0, ls, r0, rs) = (k % 5, len + k % 3, 1 + k % 7, len + 2 * (k % 4));
        let seed = 200 + 2 * k as u64;
        let local = random_buffer(&a, l0 + n * ls + 3, seed);
        let remote_init = random_bytes(r0 + n * rs + 3, seed + 1);
        let remote = b.register_buffer(remote_init.clone()).unwrap();
        let lo: Vec<usize> = (0..n).map(|i| l0 + i * ls).collect();
        let ro: Vec<usize> = (0..n).map(|i| r0 + i * rs).collect();
        let sz = vec![len; n];
        let what = format!("{n} pieces of {len} B, strides {ls} / {rs}");
        let sess = a.create_session(local.desc(), remote.desc()).unwrap();
        let uid = sess.allocate_transfer_uid();
        assert_ok(&sess.batch_write(&lo, &ro, &sz, uid), &what);
        let l = local.to_vec();
        let mut model = remote_init;
        for i in 0..n {
            model[ro[i]..ro[i] + len].copy_from_slice(&l[lo[i]..lo[i] + len]);
        }
        assert_bytes_eq(&remote.to_vec(), &model, &format!("write of {what}"));
        let fresh = random_bytes(model.len(), seed + 100);
        remote.write_at(0, &fresh);
        let mut want = local.to_vec();
        let uid = sess.allocate_transfer_uid();
        assert_ok(&sess.batch_read(&lo, &ro, &sz, uid), &what);
        for i in 0..n {
            want[lo[i]..lo[i] + len].copy_from_slice(&fresh[ro[i]..ro[i] + len]);
        }
        assert_bytes_eq(&local.to_vec(), &want, &format!("read of {what}"));
    }
}

#[test]
fn strided_batch_striped_in_whole_pieces() {
    // 1 MiB in 4 KiB pieces over 8 lanes: 128 KiB stripes of 32 whole pieces, each a run.
    strided_round_trip("stridewhole", test_cfg(), 256, 4096);
}

#[test]
fn strided_batch_striped_across_piece_boundaries() {
    // 300 × 3000 B: stripes of 112 500 B cut pieces in two, so the chunks are lists.
    strided_round_trip("strideodd", test_cfg(), 300, 3000);
}

#[test]
fn strided_batch_over_the_segment_limit() {
    // 5000 pieces of 7 B on one lane: strided chunks of 4096 and 904 segments.
    strided_round_trip("stridemany", test_cfg(), 5000, 7);
}

#[test]
fn strided_batch_in_small_chunks_on_one_lane() {
    let cfg = cfg_with(|c| {
        c.num_data_conns = 1;
        c.chunk_bytes = 7000;
        c.same_host_chunk_bytes = 7000;
    });
    // 5000 pieces of 7 B in 7000-byte chunks: five strided chunks of 1000 pieces.
    strided_round_trip("stridesmall", cfg, 5000, 7);
}

#[test]
fn overlapping_strided_destinations_are_refused_when_striped() {
    let (a, b) = pair("strideoverlap", test_cfg());
    let n = 64;
    let local = random_buffer(&a, n * 4096, 93);
    let remote_init = random_bytes(n * 2048 + 4096, 94);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    let lo: Vec<usize> = (0..n).map(|i| i * 4096).collect();
    // Remote stride 2048 < 4096 B segments: every segment overlaps the next.
    let ro: Vec<usize> = (0..n).map(|i| i * 2048).collect();
    let sess = a.create_session(local.desc(), remote.desc()).unwrap();
    let st = sess.batch_write(&lo, &ro, &vec![4096; n], sess.allocate_transfer_uid());
    assert_eq!(wait(&st), StatusCode::ErrInvalidArgs, "{}", st.message());
    assert_bytes_eq(&remote.to_vec(), &remote_init, "nothing written");
}

/// Striped writes large enough to share their stripes between their lanes
/// (`share_stripes`: at least two chunks per lane; small chunks make small writes qualify),
/// and the same writes with their stripes dealt, so both ways stay covered.
fn striping_cfg(share: bool, chunk_bytes: usize) -> morio::TcpBackendConfig {
    cfg_with(|c| {
        c.share_stripes = share;
        c.chunk_bytes = chunk_bytes;
        c.same_host_chunk_bytes = chunk_bytes;
    })
}

#[test]
fn shared_stripes_strided_batch_in_whole_pieces() {
    // 1 MiB in 4 KiB pieces over 8 lanes, 16 KiB chunks: 64 strided chunks, shared.
    strided_round_trip("sharedwhole", striping_cfg(true, 16 << 10), 256, 4096);
}

#[test]
fn shared_stripes_strided_batch_across_piece_boundaries() {
    strided_round_trip("sharedodd", striping_cfg(true, 7000), 300, 3000);
}

#[test]
fn shared_stripes_sizes() {
    // At the default 1 MiB chunks 17 MiB shares its stripes; the others are dealt.
    let (a, b) = pair("sharedsizes", striping_cfg(true, 1 << 20));
    for (i, n) in [17usize << 20, (16 << 20) + 3, (1 << 20) + 3, 65537]
        .into_iter()
        .enumerate()
    {
        write_then_read_back(&a, &b, n, 2000 + i as u64);
    }
}

#[test]
fn shared_stripes_ascending_batch() {
    ascending_batch("sharedasc", striping_cfg(true, 4096), 310);
}

#[test]
fn dealt_stripes_strided_batch_and_sizes() {
    strided_round_trip("dealtwhole", striping_cfg(false, 16 << 10), 256, 4096);
    let (a, b) = pair("dealtsizes", striping_cfg(false, 1 << 20));
    for (i, n) in [17usize << 20, (1 << 20) + 3].into_iter().enumerate() {
        write_then_read_back(&a, &b, n, 3000 + i as u64);
    }
}

#[test]
fn striped_transfers_are_answered_once_by_the_join() {
    // Whichever shard serves the chunk that completes a join answers for the whole
    // transfer: exactly one answer per transfer, the inbound status recorded before it, and
    // the same bytes whichever lane it came back on.
    let (a, b) = pair("joined", test_cfg());
    let n = (1usize << 20) + 3;
    let src = a.register_buffer(random_big(n, 77)).unwrap();
    let dst = b.register_buffer(vec![0u8; n]).unwrap();
    let back = a.register_buffer(vec![0u8; n]).unwrap();
    let rounds = 40;
    for _ in 0..rounds {
        let uid = a.allocate_transfer_uid();
        let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
        assert_ok(&st, "striped write");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
        let uid = a.allocate_transfer_uid();
        let st = a.read(back.desc(), 0, dst.desc(), 0, n, uid);
        assert_ok(&st, "striped read");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    }
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "target after striped writes");
    assert_bytes_eq(&back.to_vec(), &src.to_vec(), "striped reads back");
    let t = b.stats().unwrap().total();
    assert_eq!(t.inbound_transfers, 2 * rounds);
    assert_eq!(
        t.joined_transfers,
        2 * rounds,
        "one join answer per transfer"
    );
}
