package dev.edgespec.bridge;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;

import java.util.ArrayList;
import java.util.List;
import org.junit.Test;

/** The battery meter and the budgeted k policy with a fake battery and a fake clock. */
public class BudgetTest {
    private double now;
    private BatteryMeter.Reading reading = new BatteryMeter.Reading(false, 80.0, -500_000.0, 4000.0);

    @Test
    public void theMeterIntegratesPowerPerToken() {
        BatteryMeter meter = new BatteryMeter(() -> reading, () -> now);
        Conditions first = meter.read(0);
        assertEquals(2.0, first.powerW, 1e-12); // 0.5 A x 4 V
        assertNull(first.energyPerTokenJ);
        now = 1.0;
        reading = new BatteryMeter.Reading(false, 80.0, 1_000_000.0, 4000.0);
        Conditions second = meter.read(10);
        assertEquals(4.0, second.powerW, 1e-12);
        assertEquals(0.3, second.energyPerTokenJ, 1e-12); // (2 + 4) / 2 J over 10 tokens
        assertEquals(Boolean.FALSE, second.plugged);
        assertEquals(80.0, second.batteryPct, 0.0);
    }

    @Test
    public void aLowBatteryStopsDraftingAndChargingResumesIt() {
        BudgetPolicy policy = new BudgetPolicy(BudgetConfig.battery(20.0), false);
        BatteryMeter meter = new BatteryMeter(() -> reading, () -> now);
        BudgetedK k = new BudgetedK(KPolicy.fixed(6), policy, meter, () -> now);
        List<Integer> ks = new ArrayList<>();
        double[] percents = {80, 50, 15, 15, 90};
        boolean[] plugged = {false, false, false, true, true};
        for (int i = 0; i < percents.length; i++) {
            now = i;
            reading = new BatteryMeter.Reading(plugged[i], percents[i], 300_000.0, 3900.0);
            ks.add(k.nextK());
            k.observe(new StepRecord(i, 6, 6, 2, new int[3], 0.0, 6, 0.0));
        }
        assertEquals(java.util.Arrays.asList(3, 3, 0, 6, 6), ks);
        assertEquals(3, k.cappedRounds());
        assertEquals("battery at 15% < 20%", policy.decisions().get(1).reason);
        assertEquals("recovered (plugged in)", policy.decisions().get(2).reason);
    }

    @Test
    public void readsAreSpacedByCheckEvery() {
        int[] reads = new int[1];
        BudgetPolicy policy = new BudgetPolicy(BudgetConfig.battery(20.0), false);
        BudgetedK k = new BudgetedK(KPolicy.fixed(4), policy, tokens -> {
            reads[0]++;
            return new Conditions(now, true, 90.0, null, null, null, null);
        }, () -> now);
        for (int i = 0; i < 10; i++) {
            now = i * 0.03;
            k.nextK();
        }
        assertEquals(3, reads[0]); // at 0, 0.12 and 0.24 s with check_every 0.1 s
    }
}
