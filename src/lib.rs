//! sb-inbox: the Idempotent Consumer for Azure Service Bus.
