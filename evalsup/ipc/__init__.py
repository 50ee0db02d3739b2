"""Frames and messages between the supervisor and its workers: the only code both sides import."""

from evalsup.ipc.frames import FrameKind, FrameWriter, decode_json, encode_frame, encode_json, read_frame, split_meta

__all__ = ["FrameKind", "FrameWriter", "decode_json", "encode_frame", "encode_json", "read_frame", "split_meta"]
