//! Core cases: write, read (truly verified), batch, session, with inbound statuses.

use super::common::*;
use morio::StatusCode;

#[test]
fn write_then_read_verified() {
    let (a, b) = pair("wr", test_cfg());
    let n = 4096;
    let src = random_buffer(&a, n, 1);
    let dst = b.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::Success, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_eq!(src.to_vec(), dst.to_vec());
    // Read back fresh data: change the remote, zero the local, read, compare to the remote.
    let fresh = random_bytes(n, 2);
    dst.write_at(0, &fresh);
    let back = a.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.read(back.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::Success, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_eq!(back.to_vec(), fresh);
}
