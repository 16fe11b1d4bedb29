"""The gRPC gateway (proto/engram_grpc/memory/v1/memory.proto): translation only, over the same
service layer as the HTTP routes, served by `engram api` on its own port (api.grpc.server).

- convert: proto messages to the wire models' plain values, and result models to messages;
- params: the values HTTP takes from a path, a query or a header, as models;
- calls: one call's caller, metadata and errors (the gateway's one error handler);
- memories, forgets, operators: the services' methods;
- server: the server, with the health and reflection services.
"""
