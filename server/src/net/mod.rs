//! Connections: accepting is in [`crate::server`]; serving one client is
//! [`connection`].

pub mod connection;
mod idle_poll;
pub mod packing;
