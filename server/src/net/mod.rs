//! Connections: accepting is in [`crate::server`]; serving one client is
//! [`connection`].

mod batch;
pub mod connection;
pub mod handover;
mod idle_poll;
pub mod packing;
