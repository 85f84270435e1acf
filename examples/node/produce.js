'use strict';
/**
 * Produce messages read from standard input, one JSON object a line:
 *   {"value": "hello", "key": "user-1", "properties": {"source": "node"}}
 * and print one JSON line for each receipt (in the order messages were given), then a summary.
 *
 *   node produce.js --service-url magnetar://127.0.0.1:6650 --topic orders [--producer-name N] [--zlib]
 */
const readline = require('node:readline');
const { parseArgs } = require('node:util');
const { Client } = require('./magnetar');

const print = (object) => process.stdout.write(`${JSON.stringify(object)}\n`);

async function main() {
  const { values: args } = parseArgs({
    options: {
      'service-url': { type: 'string', default: 'magnetar://127.0.0.1:6650' },
      topic: { type: 'string' },
      'producer-name': { type: 'string' },
      zlib: { type: 'boolean', default: false },
    },
  });
  if (!args.topic) throw new Error('--topic is required');
  let reconnects = 0;
  const client = new Client(args['service-url'], {
    onEvent: (event) => {
      if (event.event === 'reconnecting') reconnects += 1;
      print(event);
    },
  });
  const producer = await client.createProducer(args.topic, {
    producerName: args['producer-name'],
    zlib: args.zlib,
  });
  print({ event: 'opened', topic: args.topic });
  // send without waiting for each receipt (they come back in order per partition)
  const receipts = [];
  for await (const line of readline.createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    const message = JSON.parse(line);
    receipts.push(
      producer.send(message).then((receipt) => {
        print({ event: 'receipt', value: message.value, ...receipt });
      }),
    );
  }
  await Promise.all(receipts);
  await producer.close();
  client.close();
  print({ event: 'done', sent: receipts.length, reconnects });
}

main().catch((error) => {
  console.error(`produce: ${error.stack ?? error}`);
  process.exit(1);
});
