//! The connection handshake: HELLO from the dialer, HELLO_ACK from the acceptor, and the
//! checks each side makes before a single request is served.

use super::codes;
use super::frame::{Hello, HelloAck};
use super::limits::{MAX_LANES, VERSION};

/// Why an acceptor refuses a HELLO: the code and message of its HELLO_ACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Wire status code.
    pub code: u32,
    /// The reason.
    pub msg: String,
}

/// The acceptor's check of a HELLO sent to engine `me`.
pub fn check_hello(hello: &Hello, me: &str) -> Result<(), Refused> {
    let bad = |msg: String| Refused {
        code: codes::ERR_INVALID_ARGS,
        msg,
    };
    if hello.version != VERSION {
        Err(bad(format!(
            "protocol version {} not supported (want {VERSION})",
            hello.version
        )))
    } else if hello.dst_key != me {
        Err(Refused {
            code: codes::ERR_NOT_FOUND,
            msg: format!("this is engine {me:?}, not {:?}", hello.dst_key),
        })
    } else if hello.src_key.is_empty() {
        Err(bad("empty engine key".to_string()))
    } else if hello.n_lanes == 0 || hello.n_lanes > MAX_LANES || hello.lane >= hello.n_lanes {
        Err(bad(format!("bad lane {} of {}", hello.lane, hello.n_lanes)))
    } else {
        Ok(())
    }
}

/// The acceptor's answer: `Ok` accepts as engine `me`, `Err` refuses.
pub fn ack(me: &str, verdict: Result<(), Refused>) -> HelloAck {
    match verdict {
        Ok(()) => HelloAck {
            version: VERSION,
            code: codes::SUCCESS,
            key: me.to_string(),
            msg: String::new(),
        },
        Err(r) => HelloAck {
            version: VERSION,
            code: r.code,
            key: String::new(),
            msg: r.msg,
        },
    }
}

/// The dialer's check of the HELLO_ACK of the engine it expects, `expected`.
pub fn check_ack(ack: &HelloAck, expected: &str) -> Result<(), String> {
    if ack.code != codes::SUCCESS {
        Err(format!("peer refused the connection: {}", ack.msg))
    } else if ack.version != VERSION {
        Err(format!(
            "peer speaks protocol version {}, we speak {VERSION}",
            ack.version
        ))
    } else if ack.key != expected {
        Err(format!(
            "peer is engine {:?}, expected {expected:?}",
            ack.key
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: VERSION,
            lane: 1,
            n_lanes: 2,
            src_key: "a".into(),
            dst_key: "b".into(),
            instance: 3,
        }
    }

    #[test]
    fn hellos_are_checked() {
        assert_eq!(check_hello(&hello(), "b"), Ok(()));
        assert_eq!(
            check_hello(&hello(), "c").unwrap_err().code,
            codes::ERR_NOT_FOUND
        );
        for h in [
            Hello {
                version: VERSION + 1,
                ..hello()
            },
            Hello {
                src_key: String::new(),
                ..hello()
            },
            Hello { lane: 2, ..hello() },
            Hello {
                n_lanes: 0,
                lane: 0,
                ..hello()
            },
            Hello {
                n_lanes: MAX_LANES + 1,
                ..hello()
            },
        ] {
            assert_eq!(
                check_hello(&h, "b").unwrap_err().code,
                codes::ERR_INVALID_ARGS,
                "{h:?}"
            );
        }
    }

    #[test]
    fn acks_are_checked() {
        assert_eq!(check_ack(&ack("b", Ok(())), "b"), Ok(()));
        assert!(check_ack(&ack("b", Ok(())), "x").is_err());
        let no = ack("b", check_hello(&hello(), "c"));
        assert!(no.key.is_empty(), "a refusal names no engine");
        assert!(check_ack(&no, "b").unwrap_err().contains("refused"));
    }
}
