"""The gRPC edge: protobuf <-> domain conversion, servicers (issue 5). Nothing below imports this."""
