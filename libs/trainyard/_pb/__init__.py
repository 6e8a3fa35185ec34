"""Protobuf and gRPC modules generated from proto/ by ``make proto``.

Never edit the modules below this package by hand; change the .proto files
and regenerate.  Import them as ``from trainyard._pb.trainyard.v1 import jobs_pb2``.
"""
