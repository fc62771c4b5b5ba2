//! Property tests for the sans-IO protocol (`morio::proto`): frame round trips and strict
//! prefixes, decoder robustness against garbage, transfer planning (`normalize`, `cut`,
//! `stripe_bytes`, ...), target-side `check_chunk`, and the `Outbound` state machine.
//!
//! One module per concern: `strategies` (the generators and helpers they share), `frames`
//! (round trips), `damage` (garbage, damaged and refused frames), `planning`, `target`
//! (`check_chunk`), `outbound` and `runs` (the run form and strided layouts).

mod damage;
mod frames;
mod outbound;
mod planning;
mod runs;
mod strategies;
mod target;
