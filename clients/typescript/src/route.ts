/**
 * Which server a call goes to: round robin over the servers of a cluster, and a run's writes
 * straight to the server that owns the run (the shard of its id, the map of owners from
 * GetCluster). Beneath the connection and everything that writes to runs (a run's handle, the
 * worker).
 *
 * @module
 */

import {
  ConnectError,
  createClient,
  createContextKey,
  createContextValues,
  type CallOptions,
  type Client as ServiceClient,
  type ContextValues,
  type StreamResponse,
  type Transport,
  type UnaryResponse,
} from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import type { DescMessage, DescMethodStreaming, DescMethodUnary, MessageInitShape } from "@bufbuild/protobuf";
import { ClusterService } from "./gen/aaa/v1/cluster_pb.js";
import { Code } from "./errors.js";

/** A server of a {@link RoundRobin}: its address, its connection, its transport, and when to try it again. */
export interface Member {
  /** "host:port", as given (without its http:// or https://). */
  readonly address: string;
  readonly sessions: Http2SessionManager;
  readonly transport: Transport;
  /** A connection attempt made by the picker is under way. */
  probing: boolean;
  /** Not tried again before this time (ms since the epoch). */
  retryAt: number;
  /** The wait after its next failed attempt (ms). */
  delay: number;
}

/** The headers argument of a {@link Transport}'s methods. */
type HeaderArg = Parameters<Transport["unary"]>[3];

/** The first and the longest wait before connecting again to a server that did not answer (ms). */
export const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 2000;

/**
 * The transport of a client of several servers: each call goes to the next server (round robin)
 * whose connection is up, as with gRPC's `round_robin` policy. A server whose connection is not up
 * is connected in the background, again after 100 ms doubling up to 2 s while it fails, and takes
 * calls again once it answers. When none is up, calls go round all of them and fail or wait for the
 * connection; the client's retries do the rest. A write of one run (a call made with
 * {@link toOwnerOf}) goes to the run's owner instead, when {@link ShardOwners} knows it.
 */
export class RoundRobin implements Transport {
  private next = 0;
  /** Which of the servers owns which runs. */
  readonly owners: ShardOwners;

  constructor(
    private readonly members: readonly Member[],
    private readonly closed: AbortSignal,
  ) {
    this.owners = new ShardOwners(this, members, closed);
  }

  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: HeaderArg,
    input: MessageInitShape<I>,
    contextValues?: ContextValues,
  ): Promise<UnaryResponse<I, O>> {
    const runId = contextValues?.get(RUN_WRITTEN);
    const owner = runId ? this.owners.ownerOf(runId) : undefined;
    if (owner === undefined) return this.pick().unary(method, signal, timeoutMs, header, input, contextValues);
    return owner.transport.unary(method, signal, timeoutMs, header, input, contextValues).catch((err: unknown) => {
      // The owner may have stopped or handed the run over: read who owns it again. A stream closed
      // under a call nobody cancelled is a connection that went away (see notCancelledError).
      const code = ConnectError.from(err).code;
      if (code === Code.Unavailable || (code === Code.Canceled && !signal?.aborted)) this.owners.markStale();
      throw err;
    });
  }

  stream<I extends DescMessage, O extends DescMessage>(
    method: DescMethodStreaming<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: HeaderArg,
    input: AsyncIterable<MessageInitShape<I>>,
    contextValues?: ContextValues,
  ): Promise<StreamResponse<I, O>> {
    return this.pick().stream(method, signal, timeoutMs, header, input, contextValues);
  }

  /** The transport of the next server that is up, else of the next one not known down, else the next. */
  private pick(): Transport {
    const now = Date.now();
    const up = this.members.map((m) => {
      const state = m.sessions.state();
      const isUp = state === "open" || state === "idle" || state === "verifying";
      if (!isUp && !m.probing && now >= m.retryAt && !this.closed.aborted) this.probe(m);
      return isUp;
    });
    const usable = up.some(Boolean) ? up : this.members.map((m) => !m.probing && m.sessions.state() !== "error");
    const n = this.members.length;
    const inTurn = Array.from({ length: n }, (_, i) => (this.next + i) % n);
    const k = inTurn.find((j) => usable[j]) ?? this.next;
    this.next = (k + 1) % n;
    return this.members[k].transport;
  }

  /** Connects a server that is not up in the background. */
  private probe(m: Member): void {
    m.probing = true;
    void m.sessions.connect().then((state) => {
      m.probing = false;
      if (state === "error") {
        m.retryAt = Date.now() + m.delay;
        m.delay = Math.min(m.delay * 2, RECONNECT_MAX_MS);
      } else {
        m.retryAt = 0;
        m.delay = RECONNECT_MIN_MS;
      }
    });
  }
}

/** The run a unary call writes to, set by {@link toOwnerOf}; "" for other calls. */
const RUN_WRITTEN = createContextKey("", { description: "the run an aaa call writes to" });

/**
 * `options` for a call that writes to run `runId` (Signal, CancelRun, a task's HeartbeatTask,
 * CompleteTask and FailTask): a client of several servers sends it to the run's owner.
 */
export function toOwnerOf(runId: string, options: CallOptions): CallOptions {
  return { ...options, contextValues: createContextValues().set(RUN_WRITTEN, runId) };
}

/**
 * The shard of a run: the last byte of its id (the UUID's last two hex digits); undefined for another id.
 * The server's rule (`RunId::shard`); tests/vectors/formats.json holds cases every language checks.
 */
export function shardOf(runId: string): number | undefined {
  const last = runId.slice(-2);
  return /^[0-9a-f]{2}$/i.test(last) ? parseInt(last, 16) : undefined;
}

/**
 * For each shard's owner (GetCluster's `shard_owners`: "host:port", "" while unowned), its index
 * in the client's `addresses`, compared as given but without an http:// or https:// prefix;
 * undefined where the shard is unowned or its owner is not one of them.
 */
export function ownerIndexes(shardOwners: readonly string[], addresses: readonly string[]): (number | undefined)[] {
  const indexOf = new Map(addresses.map((address, i) => [hostPort(address), i]));
  return shardOwners.map((owner) => (owner === "" ? undefined : indexOf.get(owner)));
}

/** An address as GetCluster names servers: without the http:// or https:// the SDK accepts, and a trailing "/". */
export function hostPort(address: string): string {
  return address.replace(/^https?:\/\//, "").replace(/\/$/, "");
}

/** How long a routed call uses the map of the runs' owners before it is read again in the background (ms). */
const OWNERS_MAX_AGE_MS = 5000;
/** How long a read of the map (GetCluster) may take (ms). */
const OWNERS_READ_TIMEOUT_MS = 5000;

/**
 * Which of the client's servers owns each shard of runs, from GetCluster, so that a run's writes go
 * straight to its owner: any server takes them, but one that does not own the run forwards them,
 * which costs the cluster CPU and the call a hop. The map is only a hint: a stale one costs that
 * hop, nothing else. It is read at connect, again in the background when a routed call finds it
 * older than 5 s, and at the next routed call after one failed with UNAVAILABLE. Separate servers
 * with embedded stores each claim every shard, so with store "embedded" nothing is routed.
 */
export class ShardOwners {
  /** GetCluster's store ("embedded" or "postgres"); "" until a server answered. */
  store = "";
  /** The owner of each shard among the members; empty (no routing) until a shared store's map is read. */
  private owners: (Member | undefined)[] = [];
  /** When the map was last read (ms since the epoch); 0: read it at the next routed call. */
  private readAt = 0;
  private reading: Promise<void> | undefined;
  private readonly cluster: ServiceClient<typeof ClusterService>;

  constructor(
    roundRobin: Transport,
    private readonly members: readonly Member[],
    private readonly closed: AbortSignal,
  ) {
    this.cluster = createClient(ClusterService, roundRobin);
  }

  /** Whether runs' writes are routed: a map of a shared store was read. */
  get routing(): boolean {
    return this.owners.length > 0;
  }

  /** The server that owns the run, when known and one of the client's; reads the map again if it is old. */
  ownerOf(runId: string): Member | undefined {
    if (this.store === "embedded") return undefined;
    if (Date.now() - this.readAt > OWNERS_MAX_AGE_MS) void this.read();
    const shard = shardOf(runId);
    return shard === undefined ? undefined : this.owners[shard];
  }

  /**
   * Forgets the map until it is read again (which the next routed call starts): meanwhile writes go
   * round robin, so the retry of a call whose owner died reaches a live server (which waits for the
   * next owner) rather than the dead one again.
   */
  markStale(): void {
    this.readAt = 0;
    this.owners = [];
  }

  /** Reads the map from any server, one read at a time; a failed read keeps the map it had (none at first). */
  read(timeoutMs = OWNERS_READ_TIMEOUT_MS): Promise<void> {
    this.reading ??= this.fetch(timeoutMs).finally(() => (this.reading = undefined));
    return this.reading;
  }

  private async fetch(timeoutMs: number): Promise<void> {
    this.readAt = Date.now();
    try {
      const cluster = await this.cluster.getCluster({}, { signal: this.closed, timeoutMs });
      const shared = cluster.store !== "embedded";
      const indexes = shared ? ownerIndexes(cluster.shardOwners, this.members.map((m) => m.address)) : [];
      this.owners = indexes.map((i) => (i === undefined ? undefined : this.members[i]));
      this.store = cluster.store;
    } catch {
      // Calls go on as they did (round robin, or to the owners read before), perhaps with a hop.
    }
  }
}
