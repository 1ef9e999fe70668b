"""How the bundled broker (tansu 0.6, memory storage) slows down as a partition fills with small
record batches, and why: produce alone stays flat; with a consumer polling the way the stream
workers do (fetch wait 5 ms), every fetch costs more with each batch the partition holds.

One topic of 4 partitions on a fresh embedded broker; --records records of 600 bytes produced by
--clients concurrent `send_and_wait` callers (acks all, linger 1 ms, as the API's producer): with
1-2 callers nearly every record is its own batch, as under light interactive load. The produce
rate is printed per block of --block records, with and without the polling consumer.

    .venv/bin/python bench/broker_batches.py
    .venv/bin/python bench/broker_batches.py --records 20000 --clients 32
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from report import load_average, machine

from entrypoints.embedded.broker import EmbeddedBroker

TOPIC = "batches"


async def run(records: int, block: int, clients: int, with_consumer: bool) -> list[float]:
    broker = EmbeddedBroker()
    broker.start()
    stop = asyncio.Event()
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(TOPIC, 4, 1)])
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=1)
        await producer.start()

        async def consume() -> None:
            consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id="probe",
                                        fetch_max_wait_ms=5, auto_offset_reset="earliest")
            await consumer.start()
            try:
                while not stop.is_set():
                    await consumer.getmany(timeout_ms=100)
            finally:
                await consumer.stop()

        polling = asyncio.create_task(consume()) if with_consumer else None
        rates = []
        payload = b"x" * 600
        for start in range(0, records, block):
            async def client(start: int, k: int) -> None:
                for j in range(start + k, start + block, clients):
                    await producer.send_and_wait(TOPIC, payload, key=str(j).encode())

            began = time.perf_counter()
            await asyncio.gather(*(client(start, k) for k in range(clients)))
            rates.append(block / (time.perf_counter() - began))
        stop.set()
        if polling:
            await polling
        await producer.stop()
        return rates
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--block", type=int, default=5_000)
    parser.add_argument("--clients", type=int, default=2)
    args = parser.parse_args()
    results = {mode: asyncio.run(run(args.records, args.block, args.clients, mode == "with a polling consumer"))
               for mode in ("produce only", "with a polling consumer")}
    print(f"machine: {machine()}; {load_average()}")
    print(f"tansu 0.6 (memory storage), 4 partitions, {args.clients} producing callers, 600-byte records; "
          f"records/s per block of {args.block:,}")
    print(f"{'records held':>14}" + "".join(f"{mode:>26}" for mode in results))
    for i in range(len(next(iter(results.values())))):
        print(f"{(i + 1) * args.block:>14,}" + "".join(f"{rates[i]:>26,.0f}" for rates in results.values()))


if __name__ == "__main__":
    main()
