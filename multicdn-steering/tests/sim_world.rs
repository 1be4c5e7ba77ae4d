//! The world simulator plays a (lighter) day on the default policy: the loop keeps its floors
//! and caps, the deadman fires within `stale_after`, and the loop is faster than static weights.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use multicdn_core::Policy;
use multicdn_steering::sim::{DEFAULT_POLICY, World, run};

#[test]
fn a_lighter_default_day_keeps_the_guardrails_and_beats_static_weights() {
    let policy = Policy::from_yaml(DEFAULT_POLICY, "simulator policy")
        .expect("the simulator's own policy is valid");
    let world = World {
        networks: 30,
        loads_per_sec: 40.0,
        ..World::default()
    };
    let report = run(&world, &policy).unwrap();

    assert_eq!(
        report.floor_violations, 0,
        "a healthy provider went under its floor"
    );
    assert!(
        report.max_moved_per_hour_bp <= f64::from(report.hourly_cap_bp) + 1e-6,
        "moved {} bp in an hour, cap {}",
        report.max_moved_per_hour_bp,
        report.hourly_cap_bp
    );
    let deadman = report
        .deadman_after_min
        .expect("the deadman fired in the pipeline outage");
    assert!(
        deadman <= report.stale_after_min,
        "deadman after {deadman} min"
    );
    assert!(
        report.capture_vs_static.0 > 0.0,
        "the loop was no faster than static weights on the mean: {:?}",
        report.capture_vs_static
    );
}
