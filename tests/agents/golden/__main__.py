from tests.agents.golden import write_v1

write_v1()
