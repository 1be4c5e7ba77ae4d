//! Loopback helpers shared by the integration tests. Each test crate uses a part of them.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod logs;
pub mod strict;
pub mod vendors;
