/**
 * The generated wire types (protoc-gen-es, from proto/aaa/v1), one namespace
 * per proto file: `pb.run.StartRunRequestSchema`, `pb.worker.WorkerService`...
 * Use them with the raw clients in `client.services`.
 *
 * @module
 */

export * as approval from "./gen/aaa/v1/approval_pb.js";
export * as grant from "./gen/aaa/v1/grant_pb.js";
export * as policy from "./gen/aaa/v1/policy_pb.js";
export * as run from "./gen/aaa/v1/run_pb.js";
export * as subscription from "./gen/aaa/v1/subscription_pb.js";
export * as types from "./gen/aaa/v1/types_pb.js";
export * as worker from "./gen/aaa/v1/worker_pb.js";
