//! The router as a [`Handler`]: the contract's route decodes the body into a [`Routed`]
//! payload, and the same route's handler takes it back out.

use std::sync::Mutex;

use super::Router;
use super::table::{Dispatch, Routed};
use crate::envelope::Contract;
use crate::ports::Tx;
use crate::runtime::handler::{Context, DecodeError, Handled, Handler, HandlerError};

impl<T: Tx + 'static> Handler<T> for Router<T> {
    type Payload = Routed;

    fn contracts(&self) -> &[Contract] {
        &self.table.contracts
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Routed, DecodeError> {
        let (route, upcast, value) = match self.table.dispatch.get(contract) {
            Some(Dispatch::Direct(index)) => (
                *index,
                None,
                self.table.routes[*index].decode(contract, body)?,
            ),
            Some(Dispatch::Upcast {
                upcaster,
                to,
                as_contract,
            }) => (*to, Some(as_contract.clone()), upcaster(body)?),
            // The envelope check admits only listed contracts; a caller that skipped it.
            None => {
                return Err(DecodeError::new(format!(
                    "no route for contract {contract}"
                )));
            }
        };
        Ok(Routed {
            route,
            upcast,
            value: Mutex::new(Some(value)),
        })
    }

    async fn handle(&self, ctx: &Context<'_, Routed>, tx: &mut T) -> Result<Handled, HandlerError> {
        let route = &self.table.routes[ctx.payload.route];
        let contract = ctx.payload.upcast.as_ref().unwrap_or(ctx.contract);
        route.handle(ctx, contract, tx).await
    }
}
