'use strict';
/**
 * A small Magnetar client for Node.js, written from the repository's .proto files alone.
 *
 * What a client in any language must do, and where this file does it:
 *
 * - Lookup (Client.lookup): any broker says who owns each partition of a topic. A producer or
 *   consumer then opens one stream per partition on that partition's owner.
 * - Produce (PartitionProducer): open with a producer name, send batches of messages with
 *   increasing sequence ids, and complete each send when its receipt comes. A batch is one
 *   serialized magnetar.format.v1.MessageBatch plus the hashes of its keys (key_shared routing).
 * - Consume (PartitionConsumer): subscribe, grant permits with Flow (the broker sends no more
 *   messages than granted), unpack each delivered EntryEnvelope, acknowledge entries once every
 *   message of them is acknowledged, and grant permits again as the application takes messages.
 * - Reconnect (PartitionStream): the broker ends a stream with a `closed` message when the
 *   partition moves or the broker stops. The client looks the partition up again and reopens:
 *   a producer under the same producer name, resending every batch not yet receipted, with the
 *   same sequence ids (the broker stores each (producer name, sequence id) once, so a resend of
 *   a stored batch gets a `duplicate` receipt instead of a second copy); a consumer subscribes
 *   again, and the broker redelivers what was not acknowledged.
 *
 * Per-key order follows from routing (a key always goes to the same partition), from one
 * stream per partition, and from resending in order before anything newer.
 *
 * 64-bit fields are read as JavaScript numbers (longs: Number): exact up to 2^53, which ids
 * and offsets of this example never reach. Plaintext connections with an optional token; over
 * TLS, give grpc.credentials.createSsl(...) instead of createInsecure() in Client.stub.
 */

const path = require('node:path');
const zlib = require('node:zlib');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

// The .proto files import each other by their path from proto/, the root of the buf module
// (import "magnetar/common/v1/types.proto").
const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const LOAD_OPTIONS = {
  keepCase: true, // field names as in the .proto files (snake_case)
  longs: Number,
  enums: String, // enum values by name: 'SUBSCRIPTION_TYPE_SHARED'
  defaults: true,
  oneofs: true, // a response says which member of its oneof is set: response.kind
  includeDirs: [PROTO_ROOT],
};
const services = grpc.loadPackageDefinition(
  protoLoader.loadSync('magnetar/broker/v1/broker.proto', LOAD_OPTIONS),
);
const BrokerService = services.magnetar.broker.v1.BrokerService;

// The persisted entry format is not a gRPC message: protobufjs encodes and decodes it.
const formats = new protobuf.Root();
formats.resolvePath = (_origin, target) => path.join(PROTO_ROOT, target);
formats.loadSync('magnetar/format/v1/entry.proto', { keepCase: true });
const MessageBatch = formats.lookupType('magnetar.format.v1.MessageBatch');
const EntryEnvelope = formats.lookupType('magnetar.format.v1.EntryEnvelope');
const TO_OBJECT = { longs: Number, enums: String, defaults: true };

const BACKOFF_MS = [100, 200, 400, 800, 1600, 3200];
const GRPC_RETRIABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);
// Refused because our previous stream is still attached (after a failover): retry.
const BUSY = new Set(['ERROR_CODE_PRODUCER_BUSY', 'ERROR_CODE_CONSUMER_BUSY']);

// --- keys and routing (magnetar.common.keys and magnetar.aio.routing in Python) ---------------

// CRC-32 (IEEE, as zlib's crc32), by table: zlib.crc32 exists only from Node.js 20.15 on.
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function fmix32(h) {
  // MurmurHash3's 32-bit finalizer
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The key_shared routing hash of a key: fmix32(CRC-32 of its UTF-8 bytes); null: no key. */
function keyHash(key) {
  return fmix32(crc32(Buffer.from(key ?? '', 'utf8')));
}

/** What a batch carries: [] when no message has a key, one hash when all keys are the same,
 * else one per message. */
function batchKeyHashes(keys) {
  if (keys.every((k) => k === null)) return [];
  if (keys.every((k) => k === keys[0])) return [keyHash(keys[0])];
  return keys.map(keyHash);
}

/** The partition of a keyed message: CRC-32 of the key modulo the partition count. */
function keyPartition(key, partitions) {
  return crc32(Buffer.from(key, 'utf8')) % partitions;
}

/** A delivered entry: its EntryEnvelope and the MessageBatch inside. */
function decodeEntry(entry) {
  const envelope = EntryEnvelope.toObject(EntryEnvelope.decode(entry), TO_OBJECT);
  let raw = envelope.batch;
  if (envelope.compression === 'COMPRESSION_TYPE_ZLIB') {
    // never inflate past what the envelope declares
    raw = zlib.inflateSync(raw, { maxOutputLength: Math.max(1, envelope.uncompressed_size) });
  } else if (envelope.compression !== 'COMPRESSION_TYPE_NONE') {
    throw new Error(`unknown compression ${envelope.compression}`);
  }
  return [envelope, MessageBatch.toObject(MessageBatch.decode(raw), TO_OBJECT)];
}

// --- small helpers ------------------------------------------------------------------------------

function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** An ErrorDetail (in a `closed` message or an in-band error) as an Error. */
class MagnetarError extends Error {
  constructor(detail) {
    super(`${detail.code}: ${detail.message}`);
    this.code = detail.code;
    this.retriable = detail.retriable;
  }
}

function isRetriable(error) {
  if (error instanceof MagnetarError) return error.retriable;
  return GRPC_RETRIABLE.has(error.code) || error.retriable === true;
}

// --- the client -------------------------------------------------------------------------------

class Client {
  /**
   * @param {string} serviceUrl 'magnetar://host:6650' or 'magnetar://h1:6650,h2:6650'
   * @param {{token?: string, onEvent?: (event: object) => void}} options a JWT token when the
   *   brokers authenticate; onEvent hears reconnects
   */
  constructor(serviceUrl, { token, onEvent } = {}) {
    const match = /^magnetar:\/\/(.+)$/.exec(serviceUrl);
    if (!match) throw new Error(`not a magnetar:// service URL: ${serviceUrl}`);
    this.brokers = match[1].split(',');
    this.token = token;
    this.onEvent = onEvent ?? (() => {});
    this.stubs = new Map();
  }

  stub(address) {
    let stub = this.stubs.get(address);
    if (stub === undefined) {
      stub = new BrokerService(address, grpc.credentials.createInsecure());
      this.stubs.set(address, stub);
    }
    return stub;
  }

  /** Credentials travel once per call or stream, as "authorization: Bearer <token>". */
  metadata() {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set('authorization', `Bearer ${this.token}`);
    return metadata;
  }

  /** Who owns each partition of `topic` (any broker answers); tries each broker in turn. */
  async lookup(topic) {
    let lastError;
    for (const address of this.brokers) {
      try {
        return await new Promise((resolve, reject) => {
          const deadline = Date.now() + 10_000;
          this.stub(address).Lookup({ topic }, this.metadata(), { deadline }, (error, reply) =>
            error ? reject(error) : resolve(reply),
          );
        });
      } catch (error) {
        lastError = error;
      }
    }
    throw lastError;
  }

  async createProducer(topic, options = {}) {
    const producer = new Producer(this, topic, options);
    await producer.start();
    return producer;
  }

  async subscribe(topic, subscription, options = {}) {
    const consumer = new Consumer(this, topic, subscription, options);
    await consumer.start();
    return consumer;
  }

  close() {
    for (const stub of this.stubs.values()) stub.close();
  }
}

// --- one partition's stream, reopened on the partition's current owner ------------------------

class PartitionStream {
  constructor(client, partitionTopic, partition) {
    this.client = client;
    this.topic = partitionTopic;
    this.partition = partition;
    this.call = null; // the open stream, null while (re)connecting
    this.closing = false;
    this.everOpened = false;
    this.opened = deferred(); // the first open
  }

  start() {
    this.run();
    return this.opened.promise;
  }

  async run() {
    let attempt = 0;
    while (!this.closing) {
      let error;
      try {
        error = await this.connectAndServe(() => {
          attempt = 0;
        });
      } catch (e) {
        error = e;
      }
      if (this.closing) return;
      const retry = isRetriable(error) || (this.everOpened && BUSY.has(error.code));
      if (!retry) {
        this.closing = true;
        this.opened.reject(error);
        this.failed(error);
        return;
      }
      const delayMs = BACKOFF_MS[Math.min(attempt++, BACKOFF_MS.length - 1)];
      const { code, message } = error;
      this.client.onEvent({ event: 'reconnecting', topic: this.topic, code, reason: message });
      await sleep(delayMs);
    }
  }

  /** Look the partition up, open a stream on its owner, serve it until it ends; why it ended. */
  async connectAndServe(onOpen) {
    // A partition is looked up by its own name: its owner is the one owner listed.
    const lookup = await this.client.lookup(this.topic);
    const owner = lookup.owners.find((o) => o.partition_topic === this.topic) ?? lookup.owners[0];
    if (!owner?.broker_url) {
      return Object.assign(new Error(`no owner for ${this.topic}`), { retriable: true });
    }
    const address = owner.broker_url.replace(/^magnetar:\/\//, '');
    return new Promise((resolve) => {
      const call = this.openCall(this.client.stub(address), this.client.metadata());
      let open = false;
      const end = (error) => {
        if (this.call !== call) return; // ended already
        this.call = null;
        this.disconnected();
        call.cancel(); // its 'error' (CANCELLED) then lands in end() and is ignored
        resolve(error);
      };
      call.on('data', (response) => {
        if (this.call !== call) return; // a stream we left
        if (response.kind === 'closed') {
          // the stream's end (and a refused open's answer): the reason says whether to retry
          const reason = response.closed.reason;
          const unspecified = !reason || reason.code === 'ERROR_CODE_UNSPECIFIED';
          end(
            unspecified
              ? Object.assign(new Error(`${address} closed the stream`), { retriable: true })
              : new MagnetarError(reason),
          );
        } else if (!open) {
          if (response.kind !== this.openedKind) {
            end(new Error(`${address} answered the open with ${response.kind}`));
            return;
          }
          open = true;
          this.everOpened = true;
          onOpen();
          this.openedStream(response[this.openedKind]);
          this.opened.resolve();
        } else {
          const error = this.response(response); // an error ends this stream: reconnect
          if (error) end(error);
        }
      });
      call.on('error', (error) => end(error));
      call.on('end', () =>
        end(Object.assign(new Error(`${address} ended the stream`), { retriable: true })),
      );
      this.call = call;
      call.write(this.openRequest());
    });
  }

  write(request) {
    if (this.call !== null) this.call.write(request);
  }

  /** Stop reconnecting and end the stream, with `last` (a close request) as its last word. */
  async close(last) {
    this.closing = true;
    const call = this.call;
    this.call = null; // what comes now is the stream's end, not a reason to reconnect
    if (call !== null) {
      call.write(last);
      call.end();
      await new Promise((resolve) => {
        call.on('status', resolve);
        call.on('error', resolve);
      });
    }
  }
}

// --- producing --------------------------------------------------------------------------------

class PartitionProducer extends PartitionStream {
  constructor(client, partitionTopic, partition, { producerName, zlib: compress, maxBatch }) {
    super(client, partitionTopic, partition);
    this.openedKind = 'opened';
    this.producerName = producerName ?? '';
    this.compress = compress ?? false;
    this.maxBatch = maxBatch ?? 100;
    this.queue = []; // [{message, done}] not in a batch yet
    this.pending = new Map(); // request id -> batch sent and not yet receipted, in send order
    this.nextRequestId = 1;
    this.nextSequenceId = null; // known once the first open said what is stored
    this.flushScheduled = false;
    this.drained = null; // resolved when nothing is queued or pending (close())
  }

  openCall(stub, metadata) {
    return stub.Produce(metadata);
  }

  openRequest() {
    // the same producer name on every reopen: deduplication is by (name, sequence id)
    return { open: { topic: this.topic, producer_name: this.producerName, properties: {} } };
  }

  openedStream(opened) {
    this.producerName = opened.producer_name;
    const reopened = this.nextSequenceId !== null;
    if (!reopened) {
      // a name used before (a restarted application) continues after what is stored
      this.nextSequenceId = opened.last_sequence_id + 1;
    }
    // resend every batch not receipted, in order, with the same sequence ids
    const unreceipted = [...this.pending.values()].map((p) => p.batch);
    if (unreceipted.length > 0) this.write({ send: { batches: unreceipted } });
    if (reopened) {
      const resent = unreceipted.reduce((sum, batch) => sum + batch.num_messages, 0);
      this.client.onEvent({ event: 'reopened', topic: this.topic, resent });
    }
    this.scheduleFlush();
  }

  disconnected() {}

  response(response) {
    if (response.kind === 'receipts') {
      for (const receipt of response.receipts.receipts) {
        const pending = this.pending.get(receipt.request_id);
        if (pending === undefined) continue;
        this.pending.delete(receipt.request_id);
        pending.dones.forEach((done, i) =>
          done.resolve({
            sequence_id: receipt.sequence_id + i,
            message_id: { ...receipt.message_id, batch_index: i },
            offset: receipt.first_offset + i,
            duplicate: receipt.duplicate,
          }),
        );
      }
    } else if (response.kind === 'error') {
      const error = new MagnetarError(response.error.error);
      // a retriable error: reconnect and resend in order, this batch included
      if (error.retriable) return error;
      // refused for good (too large, malformed): fail this batch; the stream goes on
      const pending = this.pending.get(response.error.request_id);
      if (pending !== undefined) {
        this.pending.delete(response.error.request_id);
        for (const done of pending.dones) done.reject(error);
      }
    }
    this.checkDrained();
    return null;
  }

  failed(error) {
    for (const pending of this.pending.values())
      for (const done of pending.dones) done.reject(error);
    for (const { done } of this.queue) done.reject(error);
    this.pending.clear();
    this.queue = [];
    this.checkDrained();
  }

  send(message) {
    if (this.closing) return Promise.reject(new Error(`the producer on ${this.topic} is closed`));
    const done = deferred();
    this.queue.push({ message, done });
    this.scheduleFlush();
    return done.promise;
  }

  scheduleFlush() {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // what the application sends in one turn of the event loop goes out as few batches
    setImmediate(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  /** Seal what is queued into batches and send them; only while the stream is open (batches
   * sealed now get the next sequence ids, and must follow the resent ones). */
  flush() {
    if (this.call === null || this.nextSequenceId === null) return;
    const batches = [];
    while (this.queue.length > 0) {
      const taken = this.queue.splice(0, this.maxBatch);
      const batch = this.seal(taken.map((t) => t.message));
      this.pending.set(batch.request_id, { batch, dones: taken.map((t) => t.done) });
      batches.push(batch);
    }
    if (batches.length > 0) this.write({ send: { batches } });
  }

  seal(messages) {
    const raw = Buffer.from(
      MessageBatch.encode({
        messages: messages.map((m) => ({
          value: Buffer.from(m.value),
          partition_key: m.key ?? undefined, // absent: a keyless message
          properties: m.properties ?? {},
        })),
      }).finish(),
    );
    const sequenceId = this.nextSequenceId;
    this.nextSequenceId += messages.length;
    return {
      request_id: this.nextRequestId++,
      sequence_id: sequenceId,
      last_sequence_id: sequenceId + messages.length - 1,
      num_messages: messages.length,
      // COMPRESSION_TYPE_ZLIB is the zlib format (RFC 1950), as zlib.deflateSync writes it
      batch: this.compress ? zlib.deflateSync(raw) : raw,
      compression: this.compress ? 'COMPRESSION_TYPE_ZLIB' : 'COMPRESSION_TYPE_NONE',
      uncompressed_size: raw.length,
      key_hashes: batchKeyHashes(messages.map((m) => m.key ?? null)),
      deliver_at_ms: 0,
    };
  }

  checkDrained() {
    if (this.drained !== null && this.queue.length === 0 && this.pending.size === 0) {
      this.drained.resolve();
    }
  }

  async close() {
    this.drained = deferred();
    this.checkDrained();
    await this.drained.promise;
    await super.close({ close: {} });
  }
}

class Producer {
  /** options: producerName (empty: the broker names it), zlib (compress batches), maxBatch */
  constructor(client, topic, options) {
    this.client = client;
    this.topic = topic;
    this.options = options;
    this.partitions = [];
    this.nextKeyless = 0;
  }

  async start() {
    const lookup = await this.client.lookup(this.topic);
    this.partitions = lookup.owners.map(
      (owner) =>
        new PartitionProducer(this.client, owner.partition_topic, owner.partition, this.options),
    );
    await Promise.all(this.partitions.map((p) => p.start()));
  }

  /**
   * Send {value, key?, properties?}; resolves with its receipt once the broker stored it.
   * A key always goes to the same partition; keyless messages go round robin.
   */
  send(message) {
    const n = this.partitions.length;
    const index = message.key != null ? keyPartition(message.key, n) : this.nextKeyless++ % n;
    return this.partitions[index].send(message);
  }

  /** Wait until every message sent is receipted, then end the streams. */
  async close() {
    await Promise.all(this.partitions.map((p) => p.close()));
  }
}

// --- consuming --------------------------------------------------------------------------------

class PartitionConsumer extends PartitionStream {
  constructor(consumer, partitionTopic, partition) {
    super(consumer.client, partitionTopic, partition);
    this.consumer = consumer;
    this.openedKind = 'subscribed';
    this.generation = 0; // counts streams: a message's permit belongs to the stream it came on
    this.taken = 0; // messages the application took since the last Flow
    this.entries = new Map(); // "ledger:entry" -> {id, unacked, delivered} (message indexes)
    this.nextRequestId = 1;
    this.acks = new Map(); // ack request id -> {ack, done}: sent, not yet confirmed
  }

  openCall(stub, metadata) {
    return stub.Consume(metadata);
  }

  openRequest() {
    const { subscription, type, initial, consumerName } = this.consumer;
    return {
      subscribe: {
        topic: this.topic,
        subscription,
        subscription_type: `SUBSCRIPTION_TYPE_${type.toUpperCase()}`,
        consumer_name: consumerName,
        start: { initial: `INITIAL_POSITION_${initial.toUpperCase()}` },
        durable: true, // a subscription whose acks persist (false: a reader)
      },
    };
  }

  openedStream() {
    // messages of the previous stream not yet received: the broker sends them again
    this.consumer.messages = this.consumer.messages.filter((m) => m.partitionConsumer !== this);
    // acks the last stream did not confirm go again (they are idempotent), before the flow:
    // the broker applies them first, so it does not send those messages again
    for (const { ack } of this.acks.values()) this.write({ ack });
    // after every (re)subscribe the broker holds no permits: grant the queue's worth
    this.generation += 1;
    this.taken = 0;
    this.write({ flow: { permits: this.consumer.receiverQueueSize } });
  }

  disconnected() {}

  response(response) {
    if (response.kind === 'deliveries') {
      for (const delivery of response.deliveries.deliveries) this.deliver(delivery);
    } else if (response.kind === 'ack_receipt') {
      this.acks.get(response.ack_receipt.request_id)?.done.resolve();
      this.acks.delete(response.ack_receipt.request_id);
    } else if (response.kind === 'error') {
      const error = new MagnetarError(response.error.error);
      // retriable (the partition is closing): reconnect, and the ack goes again
      if (error.retriable) return error;
      this.acks.get(response.error.request_id)?.done.reject(error);
      this.acks.delete(response.error.request_id);
    }
    return null;
  }

  deliver(delivery) {
    let envelope, batch;
    try {
      [envelope, batch] = decodeEntry(delivery.entry);
    } catch (error) {
      // a corrupt entry would block the subscription for ever: report it and acknowledge it
      this.client.onEvent({ event: 'entry_discarded', topic: this.topic, reason: error.message });
      const id = { ...delivery.message_id, batch_index: -1 };
      this.write({ ack: { ack_type: 'ACK_TYPE_INDIVIDUAL', message_ids: [id], partial: [] } });
      return;
    }
    const size = batch.messages.length;
    const indexes =
      delivery.batch_indexes.length > 0 ? delivery.batch_indexes : [...Array(size).keys()];
    const id = delivery.message_id;
    const key = `${id.ledger_id}:${id.entry_id}`;
    // key_shared may deliver an entry's messages in parts, and a redelivery repeats them
    const entry = this.entries.get(key) ?? {
      id: { ...id, batch_index: -1, batch_size: size },
      unacked: new Set(),
      delivered: new Set(),
    };
    for (const i of indexes) {
      entry.unacked.add(i);
      entry.delivered.add(i);
    }
    this.entries.set(key, entry);
    for (const i of indexes) {
      const m = batch.messages[i];
      this.consumer.arrived({
        value: Buffer.from(m.value),
        key: m.partition_key ?? null,
        properties: m.properties,
        message_id: {
          ledger_id: id.ledger_id,
          entry_id: id.entry_id,
          batch_index: i,
          partition: this.partition,
        },
        offset: envelope.first_offset + i,
        redelivery_count: delivery.redelivery_count,
        partitionConsumer: this,
        generation: this.generation,
      });
    }
  }

  /** The application took `message`: its permit comes back (half a queue at a time). */
  took(message) {
    if (message.generation !== this.generation) return; // the new stream was granted anew
    this.taken += 1;
    if (this.taken >= Math.ceil(this.consumer.receiverQueueSize / 2)) {
      this.write({ flow: { permits: this.taken } });
      this.taken = 0;
    }
  }

  /** Acknowledge one message; the entry is acked once all its delivered messages are. Resolves
   * when the broker applied the entry's ack (at once for a message whose entry still has
   * unacked messages); while reconnecting, the ack waits for the next stream. */
  ack(message) {
    const { ledger_id, entry_id, batch_index } = message.message_id;
    const key = `${ledger_id}:${entry_id}`;
    const entry = this.entries.get(key);
    if (entry === undefined) return Promise.resolve();
    entry.unacked.delete(batch_index);
    if (entry.unacked.size > 0) return Promise.resolve();
    this.entries.delete(key);
    const request_id = this.nextRequestId++;
    const ack = { ack_type: 'ACK_TYPE_INDIVIDUAL', request_id, message_ids: [], partial: [] };
    if (entry.delivered.size === entry.id.batch_size) {
      ack.message_ids.push(entry.id);
    } else {
      // only some messages of the entry came here (key_shared): ack those
      const batch_indexes = [...entry.delivered];
      ack.partial.push({ message_id: entry.id, batch_indexes, batch_size: entry.id.batch_size });
    }
    const done = deferred();
    this.acks.set(request_id, { ack, done });
    this.write({ ack });
    return done.promise;
  }

  failed(error) {
    for (const { done } of this.acks.values()) done.reject(error);
    this.acks.clear();
    this.consumer.failed(error);
  }
}

class Consumer {
  /** options: type ('exclusive' | 'failover' | 'shared' | 'key_shared', default 'shared'),
   * initial ('earliest' | 'latest'), receiverQueueSize (permits per partition), consumerName */
  constructor(client, topic, subscription, options) {
    this.client = client;
    this.topic = topic;
    this.subscription = subscription;
    this.type = options.type ?? 'shared';
    this.initial = options.initial ?? 'earliest';
    this.receiverQueueSize = options.receiverQueueSize ?? 100;
    this.consumerName = options.consumerName ?? '';
    this.partitions = [];
    this.messages = []; // arrived, not yet received
    this.waiters = []; // receive() calls waiting for a message
    this.error = null;
  }

  async start() {
    const lookup = await this.client.lookup(this.topic);
    this.partitions = lookup.owners.map(
      (owner) => new PartitionConsumer(this, owner.partition_topic, owner.partition),
    );
    await Promise.all(this.partitions.map((p) => p.start()));
  }

  arrived(message) {
    const waiter = this.waiters.shift();
    if (waiter !== undefined) this.hand(message, waiter);
    else this.messages.push(message);
  }

  hand(message, waiter) {
    message.partitionConsumer.took(message);
    waiter.resolve(message);
  }

  failed(error) {
    this.error = error;
    for (const waiter of this.waiters.splice(0)) waiter.reject(error);
  }

  /** The next message: {value, key, properties, message_id, offset, redelivery_count}. */
  receive() {
    const waiter = deferred();
    const message = this.messages.shift();
    if (message !== undefined) this.hand(message, waiter);
    else if (this.error !== null) waiter.reject(this.error);
    else this.waiters.push(waiter);
    return waiter.promise;
  }

  acknowledge(message) {
    return message.partitionConsumer.ack(message);
  }

  async close() {
    await Promise.all(this.partitions.map((p) => p.close({ close: {} })));
  }
}

module.exports = { Client, Producer, Consumer, keyHash, keyPartition, batchKeyHashes };
