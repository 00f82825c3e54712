//! A connection moving to another shard: what goes along with it
//! ([`Handover`]), and handing its socket to that shard's runtime.

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use tokio::net::TcpStream;
use tracing::warn;

use super::idle_poll::PollPlan;
use crate::shard::Shard;

/// What a connection is besides its socket and buffers: who the client is
/// and what it has set (the part of its `commands::Client` that outlives
/// one shard), and how it polls. It goes along when the connection moves
/// to another shard ([`send_socket`]).
pub(super) struct Handover {
    pub(super) resp3: bool,
    pub(super) authenticated: bool,
    pub(super) user: Arc<crate::acl::User>,
    pub(super) acl_epoch: u64,
    pub(super) no_touch: bool,
    pub(super) readonly: bool,
    pub(super) poll_plan: PollPlan,
}

impl Handover {
    /// A new connection's.
    pub(super) fn new(shared: &crate::shared::Shared) -> Handover {
        let (user, acl_epoch) = crate::commands::session::initial_user(&shared.config.acl);
        Handover {
            resp3: false,
            authenticated: !shared.config.auth_required(),
            user,
            acl_epoch,
            no_touch: false,
            readonly: false,
            poll_plan: PollPlan::default(),
        }
    }
}

/// Hands a socket to shard `to`, which registers it with its own runtime
/// and serves it with `serve` from then on: a connection accepted here
/// for a shard serving fewer, or one moving (`net::packing`). A socket that
/// cannot be registered there is closed (and what `serve` holds, its seat
/// among it, dropped).
pub fn send_socket<F, Fut>(from: &Shard, to: usize, stream: std::net::TcpStream, serve: F)
where
    F: FnOnce(Rc<Shard>, TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let _ = from.post(
        to,
        Box::new(move |s: &Shard| {
            let Some(me) = s.rc() else {
                return;
            };
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    tokio::task::spawn_local(serve(me, stream));
                }
                Err(e) => warn!("shard {to}: taking over a client connection: {e}"),
            }
        }),
    );
}
