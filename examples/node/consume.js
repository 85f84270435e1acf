'use strict';
/**
 * Receive --count messages, print each as a JSON line, acknowledge it, and exit once the broker
 * confirmed every acknowledgement. A message delivered again (it was not acknowledged when the
 * stream ended) is acknowledged again, and printed and counted once.
 *
 *   node consume.js --service-url magnetar://127.0.0.1:6650 --topic orders --subscription app \
 *     --count 10 [--type shared|exclusive|failover|key_shared] [--initial earliest|latest]
 */
const { parseArgs } = require('node:util');
const { Client } = require('./magnetar');

const print = (object) => process.stdout.write(`${JSON.stringify(object)}\n`);

async function main() {
  const { values: args } = parseArgs({
    options: {
      'service-url': { type: 'string', default: 'magnetar://127.0.0.1:6650' },
      topic: { type: 'string' },
      subscription: { type: 'string' },
      count: { type: 'string', default: '10' },
      type: { type: 'string', default: 'shared' },
      initial: { type: 'string', default: 'earliest' },
    },
  });
  if (!args.topic || !args.subscription) throw new Error('--topic and --subscription are required');
  const client = new Client(args['service-url'], { onEvent: print });
  const consumer = await client.subscribe(args.topic, args.subscription, {
    type: args.type,
    initial: args.initial,
  });
  print({ event: 'subscribed', topic: args.topic, subscription: args.subscription });
  const acks = [];
  const seen = new Set();
  let redelivered = 0;
  while (seen.size < Number(args.count)) {
    const message = await consumer.receive();
    acks.push(consumer.acknowledge(message));
    const { ledger_id, entry_id, batch_index } = message.message_id;
    const id = `${ledger_id}:${entry_id}:${batch_index}`;
    if (seen.has(id)) {
      redelivered += 1;
      continue;
    }
    seen.add(id);
    print({
      event: 'message',
      value: message.value.toString('utf8'),
      key: message.key,
      properties: message.properties,
      message_id: message.message_id,
      offset: message.offset,
      redelivery_count: message.redelivery_count,
    });
  }
  await Promise.all(acks); // every ack applied by the broker
  await consumer.close();
  client.close();
  print({ event: 'done', received: seen.size, redelivered });
}

main().catch((error) => {
  console.error(`consume: ${error.stack ?? error}`);
  process.exit(1);
});
