# One command each: `make run` starts a server on embedded defaults, `make test` runs the suite.
# Both install the project into .venv first when pyproject.toml changed since the last install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` needs only the server's dependencies (no PySpark, no test tools)
RUN_STAMP := $(VENV)/.installed-run

BENCH_STAMP := $(VENV)/.installed-bench
RESULTS := loadtest/results
# peers for `make bench-peers`: Debian's packages (nats-server lives in /usr/sbin)
PEER_BINARIES := redis-server nats-server
export PATH := $(PATH):/usr/sbin:/sbin

.PHONY: install run test test-long spark-long check disk browser etcd-server kcat cluster cluster-stop fuzz stress-test stress-quick nemesis lint typecheck bench bench-quick bench-peers peer-servers soak loadtest clean

install: $(STAMP) kcat

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

# the message port 6650, the operator's HTTP port 9650 (status page, /metrics, /healthz, /readyz),
# the Kafka protocol on 9092 (docs/KAFKA.md); when one is busy: make run PORT=6651 HTTP_PORT=9651
# KAFKA_PORT=9093 (any of the three)
PORT ?= 6650
HTTP_PORT ?= 9650
KAFKA_PORT ?= 9092
run: $(RUN_STAMP)
	$(BIN)/headwater serve --host 127.0.0.1 --port $(PORT) --http-port $(HTTP_PORT) \
		--kafka-port $(KAFKA_PORT) --data-dir ./data

# The whole suite on every core: one test module per worker at a time (the Spark modules share
# one worker and its JVM: tests/conftest.py). The timeout bounds a hang, nothing else.
# The long runs have their own target, `make test-long`, which .ci/run runs after this one: the
# fixed-seed explorations of the two fuzzers (the state machine and the pipelined admin model; their
# recorded reproductions stay here), the cluster attack modules (kill -9 rounds with uploads,
# take-overs, topics racing across brokers), Kafka transactions under kill -9 (a loop of them
# killed six times, the exactly-once application over 100,000 records, ends cut mid-way, a
# native exactly-once loop on three brokers with kill -9s, a 10,000-partition transaction), Kafka
# share groups and KIP-848 consumer groups through kill -9s of a cluster's brokers, the blocking
# client through a frozen owner, the standalone Spark cluster (four JVMs), the Spark source
# through a cluster take-over, the
# streaming query across a server restart (its task-level restart test stays in `make test`), the
# streaming query whose driver is killed twice (three driver JVMs one after the other), the sink's
# task retries (a driver of its own on local[2,4]), the incremental compaction of a 1,000,000-record
# history (122 MB of segments).
LONG_TESTS := tests/test_statemachine.py::test_state_machine \
	tests/test_statemachine.py::test_state_machine_with_auth \
	tests/test_admin_fuzz.py::test_pipelined_admin_requests_against_a_model \
	tests/test_cluster_attack.py tests/test_cluster_attack_tail.py tests/test_cluster_attack_topics.py \
	tests/test_transactions_attack.py \
	tests/test_nemesis.py::test_nemesis_keeps_every_promise \
	tests/test_attack_crash.py::test_kill_9_under_mixed_load \
	tests/test_cluster.py::test_etcd_outage_short_keeps_serving_long_fences_then_recovers \
	tests/test_cluster_coordinator.py::test_etcd_outage_short_keeps_serving_long_fences_then_recovers \
	tests/test_cluster_manifest.py::test_kill9_right_after_segment_uploads_across_take_overs_loses_nothing \
	tests/test_cluster_client.py::test_client_producer_and_consumer_ride_through_a_kill9 \
	tests/test_cluster_failover_client.py::test_frozen_owner_partitions_are_acknowledged_again_before_it_wakes \
	tests/test_cluster_failover_client.py::test_frozen_owner_subscriptions_move_to_the_new_owner_before_it_wakes \
	tests/test_cluster_failover_client.py::test_blocking_client_follows_a_dead_or_frozen_owner \
	tests/test_cluster_transactions.py::test_a_kill_of_the_broker_serving_the_id_after_the_commit_decision_commits_it_all \
	tests/test_kafka_transactions.py::test_a_consume_transform_produce_loop_killed_and_its_server_killed_is_exactly_once \
	tests/test_transactions_native_eos.py \
	tests/test_kafka_consumer_protocol.py::test_members_join_and_leave_moving_only_what_must_move \
	tests/test_kafka_share_groups.py::test_share_consumers_ride_through_kill_9_of_a_partition_owner_in_a_cluster \
	tests/test_kafka_share_groups.py::test_share_consumers_ride_through_kill_9_of_the_share_coordinator_in_a_cluster \
	tests/test_transactions_hostile.py::test_more_partitions_than_the_limit_is_refused_and_the_transaction_goes_on \
	tests/test_transactions_hostile.py::test_ten_thousand_transactional_ids_are_kept_and_each_described \
	tests/test_cluster_transactions_eos.py \
	tests/test_kafka_consumer_cluster.py \
	tests/test_transaction_disk_full.py \
	tests/test_transaction_store_outage.py \
	tests/test_cluster_kafka_eos.py \
	tests/test_readme.py::test_the_command_line_tour_runs_twice \
	tests/test_cluster_manifest.py::test_the_tail_stays_bounded_and_a_take_over_reads_it_in_place \
	tests/test_cluster_batching.py::test_kill9_of_an_owner_with_shared_objects_loses_no_acknowledged_message \
	tests/test_schemas.py::test_ten_thousand_versions_stop_at_the_limit \
	tests/test_cluster_coordinator.py::test_a_broker_starting_while_etcd_does_not_answer_waits_for_it \
	tests/test_cluster_transactions.py::test_a_transaction_of_more_partitions_than_its_head_holds_is_stored_in_chunks \
	tests/test_cluster_routing.py::test_key_shared_gives_a_key_to_one_consumer_on_every_broker \
	tests/test_cluster.py::test_kill9_moves_partitions_and_loses_nothing_acknowledged \
	tests/test_kafka_groups.py::test_three_confluent_kafka_members_rebalance_and_consume_everything \
	tests/test_cluster_failover_client.py::test_kill9_of_an_owner_holds_up_only_its_own_partitions \
	tests/test_kafka_consumer_protocol.py::test_a_member_killed_with_sigkill_is_fenced_and_its_partitions_move \
	tests/test_cluster_routing.py::test_a_restarted_bootstrap_broker_is_reached_again_without_reconnect \
	tests/test_objectstore.py::test_retention_keeps_every_acknowledged_record_across_kill_9 \
	tests/test_cluster_routing.py::test_a_leg_that_cannot_be_placed_ends_the_consumer_after_the_backoff \
	tests/test_cluster_coordinator.py::test_a_broker_that_cannot_acquire_leaves_nothing_unowned \
	tests/test_cluster_batching.py::test_a_damaged_or_deleted_shared_object_is_skipped_visibly \
	tests/test_cluster.py::test_graceful_stop_hands_off_without_redelivering_acked \
	tests/test_cluster.py::test_racing_creators_of_a_subscription_agree_on_its_start \
	tests/test_kafka_share_groups.py::test_ten_thousand_dropped_share_sessions_leave_nothing_behind \
	tests/test_request_cost.py::test_every_array_at_and_past_its_maximum_gets_its_error_without_stalling_the_loop \
	tests/test_cluster_idempotent.py::test_a_batch_resent_to_the_new_owner_after_a_kill9_is_recognised \
	tests/test_kafka_cluster.py::test_kafka_python_producer_and_group_ride_through_kill_9_of_a_partition_owner \
	tests/test_cluster_dead_letters.py::test_dead_letters_are_cluster_topics_and_survive_sigterm_and_kill9 \
	tests/test_cluster_transactions.py::test_native_acks_survive_a_kill_of_the_broker_ending_the_commit \
	tests/test_kafka_cluster.py::test_a_group_across_the_brokers_and_its_offsets_survive_kill_9_of_its_coordinator \
	tests/test_cluster_routing.py::test_exclusive_is_exclusive_across_brokers \
	tests/test_security.py::test_a_connection_that_never_authenticates_is_closed \
	tests/test_durables.py::test_map_agrees_with_a_dict_across_restarts \
	tests/test_cluster_coordinator.py::test_an_unfenced_call_outlasts_an_etcd_pause_longer_than_the_session_deadline \
	tests/test_kafka_cluster.py::test_kill_9_of_a_partition_owner_mid_stream_loses_nothing_acknowledged \
	tests/test_cluster_coordinator.py::test_a_returning_broker_takes_nothing_back_until_it_has_stayed_up \
	tests/test_status_page.py::test_status_page_renders_charts_in_chromium \
	tests/test_kafka_consumer_protocol.py::test_a_coordinator_killed_and_restarted_takes_its_members_back_as_they_were \
	tests/test_kafka_security.py::test_a_token_with_grants_produces_and_consumes \
	tests/test_kafka_cluster.py::test_a_broker_answers_not_leader_for_a_partition_it_does_not_serve \
	tests/test_cluster_failover_client.py::test_lookup_carries_the_lease_and_the_client_checks_owners_at_half_of_it \
	tests/test_cluster_failover_client.py::test_a_long_poll_names_the_new_owner_whose_first_produce_waits_for_its_take_over \
	tests/test_routing.py::test_a_batch_at_a_frozen_owner_is_checked_though_an_earlier_check_still_asks \
	tests/test_cluster_transactions.py::test_native_acks_survive_a_kill_of_an_owner_while_it_applies_them
SPARK_LONG := tests/test_spark_cluster.py \
	tests/test_spark_transactions.py::test_the_streaming_source_yields_committed_records_only \
	tests/test_spark_compaction.py::test_run_killed_before_its_manifest_is_invisible_and_rerun_is_identical \
	tests/test_spark_cli.py::test_compact_makes_snapshots_of_what_a_real_server_uploaded \
	tests/test_damaged_reads.py::test_spark_wal_source_reads_uploaded_copies_and_skips_damage_like_the_server \
	tests/test_spark_sink.py::test_a_streaming_query_in_map_mode_leaves_the_last_value_per_key \
	tests/test_spark_sink_exactly_once.py::test_a_batch_written_before_its_spark_commit_is_not_written_again \
	tests/test_spark_stream_takeover.py \
	tests/test_spark_stream_restart.py::test_a_query_rides_through_a_server_restart_exactly_once \
	tests/test_spark_compaction.py::test_one_percent_new_records_cost_a_few_percent_of_a_full_run \
	tests/test_spark_stream.py::test_a_driver_killed_twice_restarts_from_its_checkpoint_exactly_once \
	tests/test_spark_stream.py::test_on_a_standalone_cluster_a_driver_killed_twice_restarts_exactly_once \
	tests/test_spark_sink.py::test_tasks_retried_after_a_failing_udf_write_every_row_exactly_once \
	tests/test_spark_sink_exactly_once.py::test_ten_graceful_stops_and_five_driver_kills_leave_every_row_of_a_rate_stream_once \
	tests/test_spark_sink_exactly_once.py::test_a_task_retried_after_a_failing_udf_writes_its_rows_once_with_commit_task \
	tests/test_spark_sink_exactly_once.py::test_a_driver_killed_in_its_commit_writes_the_batch_once_after_the_restart \
	tests/test_spark_stream.py::test_a_stopped_query_restarts_from_its_checkpoint_exactly_once \
	tests/test_spark_compaction.py::test_small_runs_write_deltas_that_read_like_one_full_fold
test: $(STAMP) disk browser etcd-server kcat
	$(BIN)/python -m pytest -q -p no:randomly -n auto --dist loadgroup \
		$(addprefix --deselect=,$(LONG_TESTS) $(SPARK_LONG))

test-long: $(STAMP) disk etcd-server
	$(BIN)/python -m pytest -q -p no:randomly -n auto --dist loadgroup $(LONG_TESTS)
	$(BIN)/python -m pytest -q -p no:randomly $(SPARK_LONG)

# the Spark half of test-long alone
spark-long: $(STAMP)
	$(BIN)/python -m pytest -q -p no:randomly $(SPARK_LONG)

# Lint, types and the unit tier (no server, S3, etcd or Spark process): under a minute.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:randomly -m unit -n 2 --dist loadgroup

# Free space where the tests write (brokers' logs, RocksDB, etcd's 123 MB of preallocated WAL per
# cluster test, Spark): a full disk fails dozens of tests at once with errors that do not say why
# (CI, which shares the machine's disk, 2026-11-26). A passed test's folder goes when it ends
# (pyproject: tmp_path_retention_policy), so DISK_NEEDED_MB is a few tests' worth at a time.
DISK_NEEDED_MB ?= 4096
disk:
	@free=$$(df -Pm "$${TMPDIR:-/tmp}" | awk 'NR==2 {print $$4}'); \
	if [ "$$free" -lt $(DISK_NEEDED_MB) ]; then \
		echo "error: $$free MB free in $${TMPDIR:-/tmp}; the tests need $(DISK_NEEDED_MB) MB" \
			"(free some, or point TMPDIR at a disk with room)" >&2; exit 1; \
	fi

# Debian's chromium, for tests/test_status_page.py (the status page in a headless browser).
# Installed when missing and possible (root, or sudo without a password, and apt-get); when not,
# an error says so, and tests/test_status_page.py fails saying why (never a silent skip).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
		else sudo=none; fi; \
		if [ "$$sudo" = none ] || ! command -v apt-get >/dev/null 2>&1; then \
			echo "error: chromium is not installed and cannot be installed here (needs root or" \
				"passwordless sudo, and apt-get): tests/test_status_page.py will fail;" \
				"run 'apt-get install chromium' as root to include it" >&2; \
		else \
			echo "installing chromium (Debian package) for tests/test_status_page.py"; \
			$$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium || \
				echo "error: apt-get could not install chromium (see above):" \
					"tests/test_status_page.py will fail" >&2; \
		fi; \
	fi

# Debian's kcat (librdkafka's command-line client), for tests/test_kafka_clients.py. Installed when
# missing; when it cannot be (no root or passwordless sudo, no apt-get), an error says so and make
# stops: the Kafka listener's tests need a real librdkafka client.
kcat:
	@if ! command -v kcat >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
		else echo "error: kcat is not installed and cannot be installed here (needs root or" \
			"passwordless sudo): run 'apt-get install kcat' as root" >&2; exit 1; fi; \
		command -v apt-get >/dev/null 2>&1 || { echo "error: kcat is not installed and there is" \
			"no apt-get: install kcat so that 'kcat' is on the PATH" >&2; exit 1; }; \
		echo "installing kcat (Debian package) for the Kafka listener's tests"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq kcat || \
			{ echo "error: apt-get could not install kcat (see above)" >&2; exit 1; }; \
	fi

# Debian's etcd-server, for the cluster tests (tests/test_cluster_coordinator.py) and `make cluster`.
# Installed when missing; when it cannot be (no root or passwordless sudo, no apt-get), an error
# says so and make stops: the cluster tests need a real etcd.
etcd-server:
	@if ! command -v etcd >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
		else echo "error: etcd is not installed and cannot be installed here (needs root or" \
			"passwordless sudo): run 'apt-get install etcd-server' as root" >&2; exit 1; fi; \
		command -v apt-get >/dev/null 2>&1 || { echo "error: etcd is not installed and there is" \
			"no apt-get: install etcd 3.4 or later so that 'etcd' is on the PATH" >&2; exit 1; }; \
		echo "installing etcd-server (Debian package) for the cluster tests and make cluster"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq etcd-server || \
			{ echo "error: apt-get could not install etcd-server (see above)" >&2; exit 1; }; \
		command -v etcd >/dev/null 2>&1 || { echo "error: etcd-server installed but no 'etcd'" \
			"on the PATH" >&2; exit 1; }; \
	fi

# Three brokers on loopback, coordinated by etcd, sharing a moto S3 bucket (docs/CLUSTER.md).
# Everything runs in the foreground; Ctrl-C (or `make cluster-stop` from another shell) stops
# each process by the PID recorded in $(CLUSTER_DIR). Logs: $(CLUSTER_DIR)/*.log.
CLUSTER_DIR ?= .cluster
CLUSTER_ETCD_PORT ?= 2379
CLUSTER_ETCD_PEER_PORT ?= 2380
CLUSTER_S3_PORT ?= 9010
CLUSTER_BROKER_PORTS ?= 6651 6652 6653
CLUSTER_KAFKA_PORTS ?= 9093 9094 9095
CLUSTER_BUCKET ?= headwater-cluster
cluster: $(STAMP) etcd-server
	@$(MAKE) --no-print-directory cluster-stop >/dev/null
	@mkdir -p $(CLUSTER_DIR); dir="$(CLUSTER_DIR)"; \
	stop() { $(CLUSTER_STOP); echo "cluster stopped"; }; \
	trap 'stop; exit 0' INT TERM; \
	wait_port() { i=0; while ! $(BIN)/python -c "import socket,sys; \
		socket.create_connection(('127.0.0.1', $$1), 0.5)" 2>/dev/null; do \
		i=$$((i+1)); if [ $$i -ge 300 ] || ! kill -0 "$$(cat "$$dir/$$2.pid")" 2>/dev/null; then \
		echo "error: $$2 not listening on $$1 (see $$dir/$$2.log)" >&2; stop; exit 1; fi; \
		sleep 0.1; done; }; \
	etcd --name headwater --data-dir "$$dir/etcd" \
		--listen-client-urls http://127.0.0.1:$(CLUSTER_ETCD_PORT) \
		--advertise-client-urls http://127.0.0.1:$(CLUSTER_ETCD_PORT) \
		--listen-peer-urls http://127.0.0.1:$(CLUSTER_ETCD_PEER_PORT) \
		--initial-advertise-peer-urls http://127.0.0.1:$(CLUSTER_ETCD_PEER_PORT) \
		--initial-cluster headwater=http://127.0.0.1:$(CLUSTER_ETCD_PEER_PORT) \
		>"$$dir/etcd.log" 2>&1 & echo $$! >"$$dir/etcd.pid"; \
	AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
		$(BIN)/python -m moto.server -H 127.0.0.1 -p $(CLUSTER_S3_PORT) \
		>"$$dir/moto.log" 2>&1 & echo $$! >"$$dir/moto.pid"; \
	wait_port $(CLUSTER_ETCD_PORT) etcd; wait_port $(CLUSTER_S3_PORT) moto; \
	$(BIN)/python -c "import urllib.request as u; u.urlopen(u.Request( \
		'http://127.0.0.1:$(CLUSTER_S3_PORT)/$(CLUSTER_BUCKET)', method='PUT'), timeout=10)" \
		|| { echo "error: could not create the bucket in moto" >&2; stop; exit 1; }; \
	set -- $(CLUSTER_KAFKA_PORTS); \
	n=0; for port in $(CLUSTER_BROKER_PORTS); do n=$$((n+1)); kafka=$$1; shift; \
		printf '[object_store]\nbackend = "s3"\nbucket = "%s"\nendpoint_url = "%s"\nregion = "us-east-1"\n' \
			"$(CLUSTER_BUCKET)" "http://127.0.0.1:$(CLUSTER_S3_PORT)" >"$$dir/b$$n.toml"; \
		AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing \
			$(BIN)/headwater serve --config "$$dir/b$$n.toml" --host 127.0.0.1 --port $$port \
			--data-dir "$$dir/b$$n" --cluster etcd://127.0.0.1:$(CLUSTER_ETCD_PORT) \
			--advertise 127.0.0.1:$$port --broker-id b$$n --kafka-port $$kafka \
			>"$$dir/b$$n.log" 2>&1 & echo $$! >"$$dir/b$$n.pid"; \
	done; \
	n=0; for port in $(CLUSTER_BROKER_PORTS); do n=$$((n+1)); wait_port $$port b$$n; done; \
	echo "cluster up: etcd 127.0.0.1:$(CLUSTER_ETCD_PORT), S3 http://127.0.0.1:$(CLUSTER_S3_PORT)" \
		"(bucket $(CLUSTER_BUCKET)), brokers on $(CLUSTER_BROKER_PORTS) (Kafka on" \
		"$(CLUSTER_KAFKA_PORTS)); logs in $$dir/"; \
	echo "  $(BIN)/headwater cluster status --cluster etcd://127.0.0.1:$(CLUSTER_ETCD_PORT)"; \
	echo "Ctrl-C or 'make cluster-stop' stops it"; \
	while :; do for f in "$$dir"/*.pid; do \
		kill -0 "$$(cat "$$f" 2>/dev/null)" 2>/dev/null || [ ! -f "$$f" ] || { \
		echo "$$(basename "$$f" .pid) exited (see $$dir/$$(basename "$$f" .pid).log)" >&2; \
		stop; exit 1; }; done; \
		[ -f "$$dir/etcd.pid" ] || { echo "cluster stopped (make cluster-stop)"; exit 0; }; \
		sleep 1; done

# Stops what `make cluster` started, by the PIDs it recorded: the brokers first (they hand their
# partitions off and revoke their leases, which needs etcd), waiting up to 20 s for them, then
# etcd and moto. A PID now running something else (after a reboot) is left alone.
CLUSTER_STOP = for f in $(CLUSTER_DIR)/b*.pid $(CLUSTER_DIR)/etcd.pid $(CLUSTER_DIR)/moto.pid; do \
		[ -f "$$f" ] || continue; pid="$$(cat "$$f")"; rm -f "$$f"; \
		ps -p "$$pid" -o args= 2>/dev/null | grep -q -e etcd -e moto -e headwater || continue; \
		kill "$$pid" 2>/dev/null || continue; echo "stopping $$(basename "$$f" .pid) ($$pid)"; \
		i=0; while kill -0 "$$pid" 2>/dev/null && [ $$i -lt 200 ]; do i=$$((i+1)); sleep 0.1; done; \
	done
cluster-stop:
	@$(CLUSTER_STOP); true

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The long run of the state-machine test (tests/test_statemachine.py): many more examples, and a
# failure is shrunk to a minimal program. HEADWATER_FUZZ_SEED=<n> replays a run.
fuzz: $(STAMP)
	HEADWATER_FUZZ=long $(BIN)/python -m pytest -q -s tests/test_statemachine.py -k test_state_machine --timeout 7200

# The suite under CPU pressure, in a random order (docs/TESTING.md): two busy-loop processes beside
# it (tests/pressure.py starts them and stops them by PID), pytest-randomly shuffling the tests
# with a new seed each run, STRESS_RUNS runs in a row, stopping at the first failure. Each run
# prints `Using --randomly-seed=N`; `make stress-test STRESS_ARGS='-p randomly --randomly-seed=N'`
# replays that order. STRESS_ARGS picks tests too: STRESS_ARGS=tests/test_reliable.py
# The suite runs on every core as in `make test` (STRESS_WORKERS=0: one process): on 2 cores, two
# workers beside two busy processes get about half a core each.
STRESS_RUNS ?= 3
STRESS_BUSY ?= 2
STRESS_WORKERS ?= auto
STRESS_ARGS ?=
stress-test: $(STAMP) disk browser etcd-server kcat
	$(BIN)/python -m tests.pressure --busy $(STRESS_BUSY) --runs $(STRESS_RUNS) -- \
		$(BIN)/python -m pytest -p randomly -n $(STRESS_WORKERS) --dist loadgroup $(STRESS_ARGS)

# The short version, in .ci/run: once, under the same pressure, the kill -9 module, the etcd
# coordinator's tests and the timing-sensitive modules (acks, nack delays, drains, reconnects).
# The slower cluster and power-loss modules run under pressure in `make stress-test`.
STRESS_QUICK_MODULES := tests/test_reliable.py tests/test_partitions.py \
	tests/test_snapshot_server.py tests/test_subscriptions.py tests/test_producer.py \
	tests/test_cluster_coordinator.py
stress-quick: $(STAMP) disk etcd-server
	$(BIN)/python -m tests.pressure --busy $(STRESS_BUSY) --runs 1 -- \
		$(BIN)/python -m pytest -p randomly $(STRESS_QUICK_MODULES)

# The long nemesis run (tests/test_nemesis.py): a cluster under one fault after another for
# NEMESIS_SECONDS; NEMESIS_SEED replays a run (its seed is printed). `make test` runs 15 s of it.
NEMESIS_SECONDS ?= 300
nemesis: $(STAMP) etcd-server
	HEADWATER_NEMESIS_SECONDS=$(NEMESIS_SECONDS) HEADWATER_NEMESIS_SEED=$(NEMESIS_SEED) \
		$(BIN)/python -m pytest -q -s tests/test_nemesis.py

# Benchmarks and load tests need the `bench` extra too (peer clients, matplotlib); locust is in dev.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# The full matrix, three runs per row (about 10 minutes on 2 cores); charts under docs/.
bench: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.bench --output $(RESULTS)/bench-matrix.json --charts docs/

# Each row once, small counts: about a minute, to check that everything works.
bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.bench --quick

# Headwater next to Redis and NATS in one run, with the ratios.
bench-peers: $(BENCH_STAMP) peer-servers
	$(BIN)/python -m loadtest.peers --output $(RESULTS)/bench-peers.json --charts docs/

# Installs Debian's redis-server and nats-server when missing (needs root or sudo and apt-get).
peer-servers:
	@missing=""; for b in $(PEER_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (Debian packages) for the peer benchmarks"; \
		if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "error:$$missing not installed and neither root nor sudo: run 'apt-get install$$missing' as root" >&2; exit 1; fi; \
		command -v apt-get >/dev/null 2>&1 || { echo "error: no apt-get here: install$$missing by hand" >&2; exit 1; }; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq$$missing || \
			{ echo "error: could not install$$missing with apt-get (see above)" >&2; exit 1; }; \
	fi

# A steady rate for 10 minutes (SOAK_SECONDS to change), sequence numbers checked, RSS/fds sampled.
SOAK_SECONDS ?= 600
soak: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.soak --seconds $(SOAK_SECONDS) --output $(RESULTS)/soak.json --chart $(RESULTS)/soak.png

# locust headless against a server it starts; the HTML report goes to loadtest/results/.
LOCUST_USERS ?= 14
LOCUST_SECONDS ?= 30
loadtest: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.locust_run --users $(LOCUST_USERS) --seconds $(LOCUST_SECONDS)

clean:
	rm -rf $(VENV) build *.egg-info
