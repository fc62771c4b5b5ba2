//! `wait_all` over real transfers that fail: the first failure in list order, after every
//! status is terminal, in its blocking, bounded and polling forms.

use morio::StatusCode;

use super::MIB;
use crate::common::*;

#[test]
fn wait_all_returns_the_first_failure_in_list_order() {
    let (a, b) = pair("waitall", test_cfg());
    let n = 16 * MIB;
    let src = a.register_buffer(random_big(n, 80)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    let mut bogus = dst.desc().clone();
    bogus.id = 5555;
    let ok = |off: usize, len: usize| {
        a.write(
            src.desc(),
            off,
            dst.desc(),
            off,
            len,
            a.allocate_transfer_uid(),
        )
    };
    let not_found = || a.write(src.desc(), 0, &bogus, 0, 4096, a.allocate_transfer_uid());
    let invalid = || a.write(src.desc(), 0, dst.desc(), n, 1, a.allocate_transfer_uid());

    let list = [ok(0, n), not_found()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    assert_eq!(
        list[0].code(),
        StatusCode::Success,
        "wait_all(-1) waits for every status"
    );
    assert_eq!(list[1].code(), StatusCode::ErrNotFound);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "the successful one");

    let list = [not_found(), ok(0, n)];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    assert!(list.iter().all(|s| s.code().is_terminal()));

    let list = [ok(0, MIB), not_found(), invalid()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    let list = [ok(0, MIB), invalid(), not_found()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrInvalidArgs);
    assert!(list.iter().all(|s| s.code().is_terminal()));
    // Bounded and polling forms over finished statuses agree.
    assert_eq!(a.wait_all(&list, 10_000), StatusCode::ErrInvalidArgs);
    assert_eq!(a.wait_all(&list, 0), StatusCode::ErrInvalidArgs);
    let list = [ok(0, MIB), ok(MIB, MIB)];
    assert_eq!(a.wait_all(&list, -1), StatusCode::Success);
    assert_eq!(a.wait_all(&[], -1), StatusCode::Success);
}
