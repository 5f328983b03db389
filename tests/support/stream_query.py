"""A streaming query's driver in a process of its own, for tests that kill it with kill -9.

    python -m tests.support.stream_query SERVER TOPIC SINK CHECKPOINT run|drain [MASTER]

Reads TOPIC with the `headwater` source (from earliest) into a Parquet file sink at SINK with its
checkpoint at CHECKPOINT. `run`: at most 40 records a trigger, a trigger every 200 ms, until the
process is killed. `drain`: Trigger.AvailableNow, uncapped: everything readable when it starts,
then exits 0. MASTER is local[2] unless given (a standalone master's `spark://` URL).
"""

from __future__ import annotations

import sys

from headwater.spark_compaction.session import spark_session


def main(
    server: str, topic: str, sink: str, checkpoint: str, mode: str, master: str = "local[2]"
) -> None:
    conf = {"spark.sql.shuffle.partitions": "2"}
    if not master.startswith("local"):
        conf |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.memory": "512m",
            "spark.executor.memory": "512m",
            "spark.cores.max": "2",
        }
    spark = spark_session(master, conf)
    reader = (
        spark.readStream.format("headwater")
        .option("server", server)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    if mode == "run":
        reader = reader.option("maxRecordsPerTrigger", "40")
    stream = reader.load()
    writer = (
        stream.writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint)
    )
    if mode == "drain":
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime="200 milliseconds").start()
    print("started", flush=True)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
