//! Our client against our server, in-process on 127.0.0.1:0, by area.

mod links;
mod liveness;
mod request;
mod security;
mod transfer;
