//! The generated aaa.v1 wire types, clients and servers, and the descriptor
//! set that server reflection serves.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("aaa.v1");

/// Encoded `FileDescriptorSet` of proto/, google/protobuf imports included.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("aaa_descriptor");
